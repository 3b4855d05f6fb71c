// A Pusher Channels client made of pusher-js (npm), driven by the Python tests
// (opts.user, {user_id, user_info}, is who it is in presence channels):
// commands come as JSON lines on stdin, everything the client sees goes out as
// JSON lines on stdout. Private channels are authorized by the official Node
// server SDK (`pusher`), signing with the app's secret as an app server would.
//
//   node pusher_client.mjs '{"host":"127.0.0.1","port":N,"key":"K","appId":"1","secret":"S"}'
//   stdin:  {"op":"subscribe","channel":"news","events":["price"]}
//           {"op":"trigger","channel":"private-a","event":"client-x","data":{…}}
//           {"op":"signin"}   (as opts.signinAs, {id, …}; then {"type":"signed_in"} and
//                              every sendToUser event as {"type":"user_event",…})
//           {"op":"unsubscribe","channel":"news"}
//           {"op":"server_trigger","channel":"news","event":"e","data":{…}}
//                             (the official Node SDK triggers through the signed API)
//           {"op":"disconnect"}
//   opts.tls: wss:// for the client and https:// for the SDK (trust the server's
//   certificate through NODE_EXTRA_CA_CERTS)
//   stdout: {"type":"state","current":"connected","socket_id":"…"}
//           {"type":"subscribed","channel":"news"}
//           {"type":"event","channel":"news","event":"price","data":…}
//           {"type":"subscription_error","channel":"…","error":…}
//           {"type":"error","error":…}
import readline from "node:readline";
import Pusher from "pusher-js";
import PusherServer from "pusher";

const opts = JSON.parse(process.argv[2]);
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const server = new PusherServer({
  appId: opts.appId,
  key: opts.key,
  secret: opts.secret,
  host: opts.host,
  port: String(opts.port),
  useTLS: !!opts.tls,
});

const client = new Pusher(opts.key, {
  cluster: "local",
  wsHost: opts.host,
  wsPort: opts.port,
  wssPort: opts.port,
  forceTLS: !!opts.tls,
  enabledTransports: ["ws"],
  disableStats: true,
  userAuthentication: {
    customHandler: ({ socketId }, callback) => {
      callback(null, server.authenticateUser(socketId, opts.signinAs ?? { id: "nobody" }));
    },
  },
  channelAuthorization: {
    customHandler: ({ socketId, channelName }, callback) => {
      if (opts.badAuth) {
        callback(null, { auth: `${opts.key}:${"0".repeat(64)}` });
        return;
      }
      const presence = channelName.startsWith("presence-") ? opts.user : undefined;
      callback(null, server.authorizeChannel(socketId, channelName, presence));
    },
  },
});

client.connection.bind("state_change", ({ current }) => {
  out({ type: "state", current, socket_id: client.connection.socket_id ?? null });
});
client.connection.bind("error", (err) => {
  out({ type: "error", error: err?.data ?? err?.error?.data ?? String(err?.type ?? err) });
});

const rl = readline.createInterface({ input: process.stdin });
rl.on("line", (line) => {
  const cmd = JSON.parse(line);
  if (cmd.op === "subscribe") {
    const channel = client.subscribe(cmd.channel);
    channel.bind("pusher:subscription_succeeded", () => {
      const report = { type: "subscribed", channel: cmd.channel };
      if (cmd.channel.startsWith("presence-")) {
        const members = {};
        channel.members.each((m) => { members[m.id] = m.info; });
        Object.assign(report, { members, count: channel.members.count, me: channel.members.me?.id });
      }
      out(report);
    });
    channel.bind("pusher:member_added", (m) =>
      out({ type: "member_added", channel: cmd.channel, id: m.id, info: m.info }));
    channel.bind("pusher:member_removed", (m) =>
      out({ type: "member_removed", channel: cmd.channel, id: m.id }));
    channel.bind("pusher:subscription_error", (error) =>
      out({ type: "subscription_error", channel: cmd.channel, error }));
    channel.bind_global((event, data, metadata) => {
      if (event.startsWith("pusher:")) return;
      out({ type: "event", channel: cmd.channel, event, data, user_id: metadata?.user_id ?? null });
    });
  } else if (cmd.op === "trigger") {
    const sent = client.channel(cmd.channel)?.trigger(cmd.event, cmd.data) ?? false;
    out({ type: "triggered", channel: cmd.channel, event: cmd.event, sent });
  } else if (cmd.op === "signin") {
    client.user.bind_global((event, data) => out({ type: "user_event", event, data }));
    client.signin();
    client.user.signinDonePromise.then(() =>
      out({ type: "signed_in", user_data: client.user.user_data }));
  } else if (cmd.op === "unsubscribe") {
    client.unsubscribe(cmd.channel);
    out({ type: "unsubscribed", channel: cmd.channel });
  } else if (cmd.op === "server_trigger") {
    server.trigger(cmd.channel, cmd.event, cmd.data).then(
      (res) => out({ type: "server_triggered", status: res.status }),
      (err) => out({ type: "server_triggered", error: String(err?.status ?? err) }));
  } else if (cmd.op === "disconnect") {
    client.disconnect();
    setTimeout(() => process.exit(0), 100);
  }
});
rl.on("close", () => {
  client.disconnect();
  setTimeout(() => process.exit(0), 100);
});
