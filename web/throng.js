/*!
 * throng.js: the browser client for a throng server (served at /throng.js; no dependencies).
 *
 * Load it as a classic script; it defines `window.Throng`:
 *
 *   <script src="/throng.js"></script>
 *   <script>
 *     const sub = Throng.subscribe("chat:lobby", {
 *       base: location.origin,     // the server (http or https); ws:// or wss:// is derived from it
 *       name: "alice",             // chat rooms only: your name (1-32 of A-Z a-z 0-9 _ - .)
 *       since: 0,                  // "now" (default) | 0 (all history first) | a seq to resume after
 *       epoch: undefined,          // with a seq: the epoch it belongs to (as sub.epoch gave it), if known
 *       token: undefined,          // with --token-secret: the JWT, or a function returning one (or a
 *                                  // Promise of one), asked again before every connection
 *       onMessage(m) { console.log(m.seq, m.from, m.data); },  // m.binary: Uint8Array for binary payloads
 *       onEvent(e) { console.log(e.event, e.client, e.count); }, // welcome | join | leave | epoch
 *       onGap(g) { console.warn(g.count + " lost", g.reason); }, // {from, to, count, reason, epoch, initial}
 *       onState(s, info) { console.log(s, info); },  // connecting | open | reconnecting {delay, attempt} | closed
 *     });
 *     sub.send("hello");           // chat rooms: publish to the room; true if it was handed to the socket
 *     sub.close();                 // for good (no reconnect)
 *   </script>
 *
 * What it guarantees:
 * - One WebSocket (`/ws/CHANNEL?format=json`). When it drops, it reconnects with exponential backoff
 *   and full jitter: a random delay in [0, min(maxDelay, minDelay * 2^(attempt-1))] ms. The attempt
 *   count starts again once a connection has stayed open 5 s or delivered a message.
 * - Every reconnect resumes with `since=lastSeq&epoch=epoch`: whatever was published meanwhile is
 *   replayed first, and anything already seen (seq <= lastSeq in the same epoch) is dropped.
 * - What the server cannot replay is reported through onGap, never hidden: reason "too old" (history
 *   no longer holds it) or "new epoch" (the server's history started afresh, e.g. an in-memory server
 *   restarted: seqs restart at 1 and `count` says how many of the new epoch are gone; anything of the
 *   old epoch after lastSeq that you did not get is lost too). `initial` is true for a gap reported on
 *   the first connection (with since: 0 it just means older history is no longer kept).
 * - Unsequenced messages (seq 0, e.g. the dashboard feed) are passed on but never tracked.
 * - The server's close codes say whether to come back. It reconnects after 1001 (server going
 *   away, idle), 1006 (connection lost), 1011, 1013 (try again later), 1008 "slow consumer" and
 *   4001 (token expired; at once when `token` is a function, which is asked for a fresh one). It
 *   stops ("closed", with the code and reason) after 1000, 1002, 1003, 1007, 1009, any other 1008
 *   (e.g. sending on a push-only channel) and 4001 with a fixed token.
 * - since: "now" asks GET /api/channels/CHANNEL for the last seq and epoch and subscribes after them,
 *   so the subscription is exact from the moment subscribe() was called. That request needs the page
 *   to be on the server's origin (the server sends no CORS headers); if it fails, the first connection
 *   is a plain live one and positions itself on the first sequenced message.
 *
 * Properties: sub.channel, sub.lastSeq, sub.epoch, sub.state.
 */
(function (global) {
  "use strict";

  var CHANNEL_RE = /^[A-Za-z0-9_\-.:@]{1,128}$/;
  var NAME_RE = /^[A-Za-z0-9_\-.]{1,32}$/;
  var STABLE_MS = 5000;

  function noop() {}

  function Subscription(channel, options) {
    var o = options || {};
    if (!CHANNEL_RE.test(channel)) throw new TypeError("Throng: bad channel name: " + channel);
    if (o.name != null && o.name !== "" && !NAME_RE.test(o.name)) {
      throw new TypeError("Throng: a name is 1-32 characters of A-Z a-z 0-9 _ - .");
    }
    var now = o.since == null || o.since === "now", since = now ? 0 : Number(o.since);
    if (!(since >= 0)) throw new TypeError('Throng: since is "now", 0 or a seq');
    var base = String(o.base || global.location.origin).replace(/\/+$/, "");
    this.channel = channel;
    this.name = o.name || null;
    this.state = "connecting";
    this.lastSeq = Math.floor(since);
    this.epoch = o.epoch || null;
    this._http = base;
    this._ws = base.replace(/^http/, "ws");
    this._token = o.token || null;
    this._now = now;                // since "now" (the default)
    this._positioned = !now;        // do we know where we are (lastSeq)?
    this._handlers = {
      message: o.onMessage || noop, event: o.onEvent || noop,
      gap: o.onGap || noop, state: o.onState || noop,
    };
    this._minDelay = o.minDelay > 0 ? o.minDelay : 500;
    this._maxDelay = o.maxDelay > 0 ? o.maxDelay : 15000;
    this._attempt = 0;          // failed attempts in a row
    this._connections = 0;      // sockets opened so far
    this._socket = null;
    this._retryTimer = null;
    this._stableTimer = null;
    this._closed = false;
    var self = this;
    this._onOnline = function () { self._retryNow(); };
    if (global.addEventListener) global.addEventListener("online", this._onOnline);
    // Start on the next microtask so that `sub` is assigned before the first callback.
    Promise.resolve().then(function () {
      if (self._closed) return;
      self._setState("connecting", {});
      self._start();
    });
  }

  Subscription.prototype.send = function (text) {
    var ws = this._socket;
    if (!ws || ws.readyState !== 1) return false;
    ws.send(String(text));
    return true;
  };

  Subscription.prototype.close = function () {
    if (this._closed) return;
    this._closed = true;
    clearTimeout(this._retryTimer);
    clearTimeout(this._stableTimer);
    if (global.removeEventListener) global.removeEventListener("online", this._onOnline);
    var ws = this._socket;
    this._socket = null;
    if (ws) {
      ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
      try { ws.close(1000); } catch (e) { /* already closing */ }
    }
    this._setState("closed", {});
  };

  // Where to start: known (a seq) or, for "now", ask the server first.
  Subscription.prototype._start = function () {
    if (this._positioned) return this._connect();
    var self = this;
    fetch(this._http + "/api/channels/" + this.channel, { cache: "no-store" })
      .then(function (r) {
        if (r.ok) return r.json();
        if (r.status >= 400 && r.status < 500) {
          return r.text().then(function (t) { throw { fatal: true, status: r.status, error: t.trim() }; });
        }
        throw new Error("HTTP " + r.status);
      })
      .then(function (info) {
        if (self._closed) return;
        self.lastSeq = info.last_seq || 0;
        self.epoch = info.epoch || null;
        self._positioned = true;
        self._connect();
      })
      .catch(function (err) {
        if (self._closed) return;
        if (err && err.fatal) {
          self._closed = true;
          self._setState("closed", { status: err.status, error: err.error });
          return;
        }
        self._connect();  // unreachable or cross-origin: a plain live subscription
      });
  };

  // The token for the next connection: fixed, or asked of the page each time.
  Subscription.prototype._connect = function () {
    if (typeof this._token !== "function") return this._open(this._token);
    var self = this;
    Promise.resolve()
      .then(function () { return self._token(); })
      .then(function (t) { if (!self._closed) self._open(t); },
            function (e) { self._reconnect({ error: "token: " + String(e) }); });
  };

  Subscription.prototype._open = function (token) {
    var q = ["format=json"];
    if (this._positioned) {
      q.push("since=" + this.lastSeq);
      if (this.epoch) q.push("epoch=" + encodeURIComponent(this.epoch));
    }
    if (this.name) q.push("name=" + encodeURIComponent(this.name));
    if (token) q.push("token=" + encodeURIComponent(token));
    var ws;
    try {
      ws = new WebSocket(this._ws + "/ws/" + this.channel + "?" + q.join("&"));
    } catch (e) {
      return this._reconnect({ error: String(e) });
    }
    var self = this;
    var initial = this._connections === 0;
    this._socket = ws;
    ws.onopen = function () {
      self._connections++;
      self._setState("open", { attempt: self._attempt });
      self._stableTimer = setTimeout(function () { self._attempt = 0; }, STABLE_MS);
    };
    ws.onmessage = function (e) {
      if (typeof e.data !== "string") return;
      var m;
      try { m = JSON.parse(e.data); } catch (err) { return; }
      if (m.event) self._onEvent(m, initial); else self._onMessage(m);
    };
    ws.onclose = function (e) {
      if (self._socket !== ws) return;
      self._socket = null;
      clearTimeout(self._stableTimer);
      var info = { code: e.code, reason: e.reason };
      if (isFinal(e.code, e.reason, typeof self._token === "function")) {
        self._closed = true;
        if (global.removeEventListener) global.removeEventListener("online", self._onOnline);
        self._setState("closed", info);
        return;
      }
      if (e.code === 4001) self._attempt = 0;  // a fresh token: no reason to wait long
      self._reconnect(info);
    };
  };

  Subscription.prototype._onEvent = function (ev, initial) {
    if (ev.event === "epoch") {
      if (this.epoch && ev.epoch !== this.epoch) this.lastSeq = 0;  // a gap event says what is gone
      this.epoch = ev.epoch;
      this._positioned = true;
      this._emit("event", ev);
    } else if (ev.event === "gap") {
      if (ev.reason === "new epoch") this.lastSeq = 0;  // seqs restart: take what is replayed
      if (ev.epoch) this.epoch = ev.epoch;
      var count = ev.to >= ev.from ? ev.to - ev.from + 1 : 0;
      // since "now" found the channel reset between asking and subscribing: nothing was missed.
      if (initial && this._now && count === 0) return;
      this._emit("gap", {
        channel: ev.channel, from: ev.from, to: ev.to, count: count,
        reason: ev.reason, epoch: ev.epoch, initial: initial,
      });
    } else {
      this._emit("event", ev);
    }
  };

  Subscription.prototype._onMessage = function (m) {
    var seq = m.seq || 0;
    if (seq > 0) {
      if (this._positioned && seq <= this.lastSeq) return;  // seen already
      this.lastSeq = seq;
      this._positioned = true;
    }
    this._attempt = 0;  // a delivered message: the connection works
    var msg = { channel: m.channel, seq: seq, data: m.data };
    if (m.from != null) msg.from = m.from;
    if (m.encoding === "base64") msg.binary = decodeBase64(m.data);
    this._emit("message", msg);
  };

  Subscription.prototype._reconnect = function (info) {
    if (this._closed) return;
    this._attempt++;
    var cap = Math.min(this._maxDelay, this._minDelay * Math.pow(2, this._attempt - 1));
    var delay = Math.round(Math.random() * cap);  // full jitter
    var self = this;
    info.delay = delay;
    info.attempt = this._attempt;
    this._setState("reconnecting", info);
    this._retryTimer = setTimeout(function () { self._retryTimer = null; self._start(); }, delay);
  };

  // The browser says the network is back: do not wait out the backoff.
  Subscription.prototype._retryNow = function () {
    if (this._closed || this._retryTimer === null) return;
    clearTimeout(this._retryTimer);
    this._retryTimer = null;
    this._start();
  };

  Subscription.prototype._setState = function (state, info) {
    this.state = state;
    this._emit("state", state, info);
  };

  // A throwing handler must not break the subscription: report it and go on.
  Subscription.prototype._emit = function (kind, a, b) {
    try {
      this._handlers[kind].call(this, a, b);
    } catch (err) {
      setTimeout(function () { throw err; }, 0);
    }
  };

  // Whether the server's close code says not to come back (see the top of this file).
  function isFinal(code, reason, canRefresh) {
    if (code === 4001) return !canRefresh;
    if (code === 1008) return reason !== "slow consumer";
    return code === 1000 || code === 1002 || code === 1003 || code === 1007 || code === 1009;
  }

  function decodeBase64(s) {
    var bin = atob(s);
    var out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  // The token a page was opened with: `#token=JWT` (a fragment never reaches a
  // server, a proxy or a log), or `?token=JWT` as before. Either is taken out of
  // the address bar and the history at once, and kept for this tab only.
  function pageToken() {
    var loc = global.location;
    if (!loc) return undefined;
    var hash = new URLSearchParams(loc.hash.replace(/^#/, ""));
    var query = new URLSearchParams(loc.search);
    var token = hash.get("token") || query.get("token");
    if (token) {
      hash.delete("token"); query.delete("token");
      var q = query.toString(), h = hash.toString();
      try {
        global.history.replaceState(null, "", loc.pathname + (q ? "?" + q : "") + (h ? "#" + h : ""));
      } catch (e) { /* no history API */ }
      try { global.sessionStorage.setItem("throng.token", token); } catch (e) { /* private mode */ }
      return token;
    }
    try { return global.sessionStorage.getItem("throng.token") || undefined; } catch (e) { return undefined; }
  }

  global.Throng = {
    version: "1",
    subscribe: function (channel, options) { return new Subscription(channel, options); },
    pageToken: pageToken,
  };
})(typeof window !== "undefined" ? window : this);
