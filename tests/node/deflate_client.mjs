// The `ws` client (npm) with permessage-deflate, against `throng serve
// --permessage-deflate`, driven by tests/python/test_deflate_clients.py.
//
//   node deflate_client.mjs '{"mode":"echo","url":"ws://…/echo","deflate":true|{…},"sizes":[…]}'
//       `deflate` is ws's perMessageDeflate option (default true). Prints
//       {"type":"open","header":…,"extensions":…} once connected, then sends, for
//       each size, a text message of that many bytes and a binary one (made here,
//       deterministic), waits for each echo and compares it; prints one report
//       {"type":"echoes","echoes":[{"size","binary","equal","sha256"}]} and exits 0.
//   node deflate_client.mjs '{"mode":"subscribe","url":"ws://…/ws/C?format=json","count":K}'
//       prints {"type":"open",…}, then {"type":"message","binary","length","data"}
//       for each of K messages, then exits 0.
//
// Every mode gives up after `timeoutMs` (default 20 s) with exit code 2.

import crypto from "node:crypto";
import WebSocket from "ws";

const opts = JSON.parse(process.argv[2] || "{}");
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const fail = (why) => {
  out({ type: "error", error: String(why && why.stack ? why.stack : why) });
  process.exit(2);
};
setTimeout(() => fail(`timed out after ${opts.timeoutMs || 20000} ms`), opts.timeoutMs || 20000).unref();

function connect() {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(opts.url, { perMessageDeflate: opts.deflate ?? true });
    let header = null;
    ws.once("upgrade", (res) => { header = res.headers["sec-websocket-extensions"] ?? null; });
    ws.once("open", () => {
      out({ type: "open", header, extensions: ws.extensions });
      resolve(ws);
    });
    ws.once("error", reject);
  });
}

// Compressible, not trivial: JSON lines with varying numbers.
function text(size) {
  let s = "";
  for (let i = 0; s.length < size; i++) s += `{"i":${i},"sym":"S${i % 17}","px":${100 + (i * 7) % 50}.25}\n`;
  return s.slice(0, size);
}

function binary(size) {
  const b = Buffer.alloc(size);
  for (let i = 0; i < size; i++) b[i] = (i % 64) ^ ((i >> 10) & 0xff);
  return b;
}

const sha256 = (data) => crypto.createHash("sha256").update(data).digest("hex");

function nextMessage(ws) {
  return new Promise((resolve, reject) => {
    const onMessage = (data, isBinary) => { ws.off("close", onClose); resolve({ data, isBinary }); };
    const onClose = (code) => { ws.off("message", onMessage); reject(new Error(`closed with ${code}`)); };
    ws.once("message", onMessage);
    ws.once("close", onClose);
  });
}

async function echo() {
  const ws = await connect();
  const echoes = [];
  for (const size of opts.sizes) {
    for (const isBinary of [false, true]) {
      const sent = isBinary ? binary(size) : text(size);
      const back = nextMessage(ws);
      ws.send(sent, { binary: isBinary });
      const { data, isBinary: gotBinary } = await back;
      const want = Buffer.from(sent);
      echoes.push({ size, binary: gotBinary, sentBinary: isBinary, equal: Buffer.compare(data, want) === 0,
                    sha256: sha256(data) });
    }
  }
  out({ type: "echoes", echoes });
  ws.close(1000);
}

async function subscribe() {
  const ws = await connect();
  for (let i = 0; i < opts.count; i++) {
    const { data, isBinary } = await nextMessage(ws);
    out({ type: "message", binary: isBinary, length: data.length,
          data: isBinary ? data.toString("base64") : data.toString("utf8") });
  }
  ws.close(1000);
}

({ echo, subscribe })[opts.mode]().then(
  () => setTimeout(() => process.exit(0), 50),
  fail,
);
