// Checks Pusher webhook requests with the official Node server SDK (`pusher`),
// as an app server receiving them would: one JSON line per request on stdin,
// {"headers": {lower-case name: value}, "body": "…"}, answered by one line,
// {"valid": bool, "events": […] or null}.
//
//   node verify_webhook.mjs '{"appId":"1","key":"K","secret":"S"}'
import readline from "node:readline";
import PusherServer from "pusher";

const opts = JSON.parse(process.argv[2]);
const server = new PusherServer({ appId: opts.appId, key: opts.key, secret: opts.secret });
const rl = readline.createInterface({ input: process.stdin });
rl.on("line", (line) => {
  const request = JSON.parse(line);
  const hook = server.webhook({ headers: request.headers, rawBody: request.body });
  const valid = hook.isValid();
  process.stdout.write(JSON.stringify({ valid, events: valid ? hook.getEvents() : null }) + "\n");
});
