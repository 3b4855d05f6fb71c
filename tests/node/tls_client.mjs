// Node's TLS against `throng serve --tls-cert --tls-key`, driven by
// tests/python/test_tls_clients.py: the `ws` client (npm) given the test CA with
// its `ca:` option, and Node's own `https` and `fetch` trusting the CA through
// NODE_EXTRA_CA_CERTS (set by the test, only for the "publish" mode).
//
//   node tls_client.mjs '{"mode":"echo","port":N,"ca":"ca.pem","messages":[...]}'
//       echoes each message (and a 60 KB binary one) over wss://localhost:N/echo,
//       then dials again without `ca` (which must be refused); prints one JSON
//       report: {tls, echoes, big, untrusted}.
//   node tls_client.mjs '{"mode":"subscribe","port":N,"ca":"ca.pem","channel":C,"count":K}'
//       prints {"type":"open"} once subscribed to wss://localhost:N/ws/C?format=json,
//       then {"type":"message",...} for each of K messages, then exits.
//   node tls_client.mjs '{"mode":"publish","port":N,"channel":C,"messages":[a,b]}'
//       publishes a with https.request and b with fetch; prints
//       {"https": {status, body, protocol, alpn}, "fetch": {status, body}}.
//
// Every mode gives up after `timeoutMs` (default 10 s) with exit code 2.

import fs from "node:fs";
import https from "node:https";
import WebSocket from "ws";

const opts = JSON.parse(process.argv[2] || "{}");
const base = `localhost:${opts.port}`;
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const fail = (why) => {
  out({ type: "error", error: String(why && why.stack ? why.stack : why) });
  process.exit(2);
};
setTimeout(() => fail(`timed out after ${opts.timeoutMs || 10000} ms`), opts.timeoutMs || 10000).unref();

function tlsInfo(socket) {
  return {
    protocol: socket.getProtocol(),
    alpn: socket.alpnProtocol || null,
    authorized: socket.authorized,
    cipher: socket.getCipher().name,
    peerCN: socket.getPeerCertificate().subject?.CN ?? null,
  };
}

function open(url, wsOptions) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, wsOptions);
    ws.once("open", () => resolve(ws));
    ws.once("error", reject);
  });
}

// Sends each payload and waits for its echo, in order.
async function echoAll(ws, payloads) {
  const got = [];
  for (const p of payloads) {
    const back = new Promise((resolve, reject) => {
      ws.once("message", (data, isBinary) => resolve({ data, isBinary }));
      ws.once("close", (code) => reject(new Error(`closed with ${code} before the echo`)));
    });
    ws.send(p);
    const { data, isBinary } = await back;
    ws.removeAllListeners("close");
    got.push({ data, isBinary });
  }
  return got;
}

async function echoMode() {
  const ca = fs.readFileSync(opts.ca);
  const ws = await open(`wss://${base}/echo`, { ca, ALPNProtocols: ["http/1.1"] });
  const tls = tlsInfo(ws._socket);
  const texts = await echoAll(ws, opts.messages);
  const big = Buffer.alloc(60 * 1024);
  for (let i = 0; i < big.length; i++) big[i] = (i * 7 + (i >> 8)) & 0xff;
  const [bigBack] = await echoAll(ws, [big]);
  ws.close(1000);

  // The same client without the test CA: Node's roots do not know it.
  let untrusted;
  try {
    const w = await open(`wss://${base}/echo`, {});
    w.terminate();
    untrusted = { connected: true };
  } catch (e) {
    untrusted = { connected: false, code: e.code || null, message: e.message };
  }
  out({
    tls,
    echoes: texts.map((e) => ({ text: e.data.toString("utf8"), binary: e.isBinary })),
    big: { binary: bigBack.isBinary, length: bigBack.data.length, equal: Buffer.compare(bigBack.data, big) === 0 },
    untrusted,
  });
  process.exit(0);
}

async function subscribeMode() {
  const ca = fs.readFileSync(opts.ca);
  const ws = await open(`wss://${base}/ws/${opts.channel}?format=json`, { ca });
  let left = opts.count;
  ws.on("message", (data) => {
    const m = JSON.parse(data.toString("utf8"));
    if (m.event) return; // control events (none expected on a plain channel)
    out({ type: "message", ...m });
    if (--left === 0) {
      ws.close(1000);
      ws.once("close", () => process.exit(0));
    }
  });
  ws.on("close", (code) => { if (left > 0) fail(`closed with ${code} after ${opts.count - left} messages`); });
  out({ type: "open", tls: tlsInfo(ws._socket) });
}

function httpsPublish(channel, body) {
  return new Promise((resolve, reject) => {
    // No `ca` here: the CA comes from NODE_EXTRA_CA_CERTS.
    const req = https.request(`https://${base}/api/publish/${channel}`, {
      method: "POST",
      headers: { "content-type": "text/plain; charset=utf-8" },
      ALPNProtocols: ["http/1.1"],
      agent: false,
    }, (res) => {
      const chunks = [];
      const info = tlsInfo(res.socket);
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString("utf8"), ...info }));
    });
    req.on("error", reject);
    req.end(body);
  });
}

async function publishMode() {
  const [first, second] = opts.messages;
  const viaHttps = await httpsPublish(opts.channel, first);
  const res = await fetch(`https://${base}/api/publish/${opts.channel}`, {
    method: "POST",
    headers: { "content-type": "text/plain; charset=utf-8" },
    body: second,
  });
  out({ https: viaHttps, fetch: { status: res.status, body: await res.text() } });
  process.exit(0);
}

const modes = { echo: echoMode, subscribe: subscribeMode, publish: publishMode };
if (!modes[opts.mode]) fail(`unknown mode ${opts.mode}`);
modes[opts.mode]().catch(fail);
