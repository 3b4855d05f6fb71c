// Laravel Echo (npm) on pusher-js, as a Laravel front end uses it, driven by the
// Python tests like pusher_client.mjs: commands as JSON lines on stdin, what Echo
// reports as JSON lines on stdout. Channels are authorized by the official Node
// server SDK, as Laravel's /broadcasting/auth would.
//
//   stdin:  {"op":"private","channel":"orders","event":".shipped"}
//           {"op":"join","channel":"lobby"}      (presence: here/joining/leaving/whispers)
//           {"op":"whisper","channel":"lobby","event":"typing","data":{…}}
//           {"op":"leave","channel":"lobby"}
//   stdout: {"type":"state","current":"connected","socket_id":"…"}
//           {"type":"event","channel":"orders","event":".shipped","data":…}
//           {"type":"here","channel":"lobby","users":[…]}, {"type":"joining",…},
//           {"type":"leaving",…}, {"type":"whisper",…}
import readline from "node:readline";
import Echo from "laravel-echo";
import Pusher from "pusher-js";
import PusherServer from "pusher";

const opts = JSON.parse(process.argv[2]);
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const server = new PusherServer({
  appId: opts.appId, key: opts.key, secret: opts.secret,
  host: opts.host, port: String(opts.port), useTLS: false,
});

const echo = new Echo({
  broadcaster: "pusher",
  Pusher,
  key: opts.key,
  cluster: "local",
  wsHost: opts.host,
  wsPort: opts.port,
  forceTLS: false,
  enabledTransports: ["ws"],
  disableStats: true,
  authorizer: (channel) => ({
    authorize: (socketId, callback) => {
      const presence = channel.name.startsWith("presence-") ? opts.user : undefined;
      callback(null, server.authorizeChannel(socketId, channel.name, presence));
    },
  }),
});

echo.connector.pusher.connection.bind("state_change", ({ current }) => {
  out({ type: "state", current, socket_id: echo.socketId() ?? null });
});

const rl = readline.createInterface({ input: process.stdin });
rl.on("line", (line) => {
  const cmd = JSON.parse(line);
  if (cmd.op === "private") {
    echo.private(cmd.channel)
      .subscribed(() => out({ type: "subscribed", channel: cmd.channel }))
      .listen(cmd.event, (data) => out({ type: "event", channel: cmd.channel, event: cmd.event, data }));
  } else if (cmd.op === "join") {
    echo.join(cmd.channel)
      .here((users) => out({ type: "here", channel: cmd.channel, users }))
      .joining((user) => out({ type: "joining", channel: cmd.channel, user }))
      .leaving((user) => out({ type: "leaving", channel: cmd.channel, user }))
      .listenForWhisper("typing", (data) => out({ type: "whisper", channel: cmd.channel, data }));
  } else if (cmd.op === "whisper") {
    echo.join(cmd.channel).whisper(cmd.event, cmd.data);
    out({ type: "whispered", channel: cmd.channel });
  } else if (cmd.op === "leave") {
    echo.leave(cmd.channel);
    out({ type: "left", channel: cmd.channel });
  } else if (cmd.op === "disconnect") {
    echo.disconnect();
    setTimeout(() => process.exit(0), 100);
  }
});
rl.on("close", () => {
  echo.disconnect();
  setTimeout(() => process.exit(0), 100);
});
