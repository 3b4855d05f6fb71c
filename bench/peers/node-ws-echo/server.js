// node-ws-echo: the `ws` package echo server, default options, echo at /echo.
'use strict';
const http = require('http');
const { WebSocketServer } = require('ws');

let addr = '127.0.0.1:8080';
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  if (argv[i] === '--addr' || argv[i] === '-addr') addr = argv[++i];
  else if (argv[i].startsWith('--addr=')) addr = argv[i].slice(7);
  else { console.error(`unknown argument ${argv[i]}`); process.exit(2); }
}
const idx = addr.lastIndexOf(':');
const host = addr.slice(0, idx);
const port = Number(addr.slice(idx + 1));

const server = http.createServer((req, res) => {
  if (req.url === '/healthz') { res.end('ok'); return; }
  res.statusCode = 404; res.end();
});
const wss = new WebSocketServer({ server, path: '/echo' });
wss.on('connection', (ws) => {
  ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary }));
  ws.on('error', () => {});
});
server.listen(port, host, () => console.error(`listening on ${host}:${port}`));
