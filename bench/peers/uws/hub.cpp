// uws-hub: a uWebSockets fan-out peer for bench/fanout.sh, with the same HTTP
// API as bench/peers/gorilla-hub, built on uWS's own pub/sub (topics):
//
//   WebSocket  /ws/{channel}            subscribes to topic {channel}; each
//                                       published payload arrives as one frame
//   POST       /api/publish/{channel}   body = payload (text frame if
//                                       Content-Type starts with text/, else
//                                       binary); answers {"seq":N} per channel
//   GET        /api/stats               subscribers, channels, published,
//                                       dropped_slow_clients, lagged_messages
//   GET        /healthz                 ok
//
// One uWS event loop on one thread. Compression off; a subscriber whose
// unsent data exceeds maxBackpressure (64 KiB, uWS's default) misses messages
// (counted in lagged_messages) rather than being closed.
//
// Usage: uws-hub [--addr 127.0.0.1:8080]
//
// hub-tls.cpp compiles this file with UWS_HUB_TLS defined (and build.sh --tls
// with -DLIBUS_USE_OPENSSL) into uws-hub-tls: the same server on uWS::SSLApp,
// TLS terminated by uSockets' OpenSSL layer, like uws-echo-tls:
//   uws-hub-tls --cert CERT.pem --key KEY.pem [--addr 127.0.0.1:8080]
//   uws-hub-tls --version   (the OpenSSL it runs with)
// Without UWS_HUB_TLS the preprocessed source is the plain uws-hub as before.
//
// hub-deflate.cpp compiles this file with UWS_HUB_DEFLATE defined (build.sh
// --deflate, with zlib: no -DUWS_NO_ZLIB, -lz) into uws-hub-deflate: the same
// server with permessage-deflate, uWS's SHARED_COMPRESSOR (one zlib deflate
// stream per event loop, reset after every message, so every frame is compressed
// without context takeover; client frames are not inflated, uWS's default
// decompressor DISABLED), and every publish sent with compress = true: uWS
// compresses it for each subscriber that negotiated the extension (plain for the
// others). Same flags and API as uws-hub:
//   uws-hub-deflate [--addr 127.0.0.1:8080]
#include "App.h"
#include "common.h"

#if defined(UWS_HUB_TLS) && defined(UWS_HUB_DEFLATE)
#error "uws-hub is built with TLS or with deflate, not both"
#endif
#ifdef UWS_HUB_TLS
#define HUB_NAME "uws-hub-tls"
#elif defined(UWS_HUB_DEFLATE)
#define HUB_NAME "uws-hub-deflate"
#else
#define HUB_NAME "uws-hub"
#endif
#ifdef UWS_HUB_DEFLATE
#define HUB_COMPRESSION uWS::SHARED_COMPRESSOR
#define HUB_COMPRESS_PUBLISH true
#else
#define HUB_COMPRESSION uWS::DISABLED
#define HUB_COMPRESS_PUBLISH false
#endif

#include <csignal>
#include <memory>
#include <unistd.h>
#include <unordered_map>

struct Sub {
    std::string channel;
};

static const size_t kMaxPublish = 64 * 1024;

static std::unordered_map<std::string, uint64_t> g_seq;  // channel -> last seq
static long long g_subscribers = 0, g_published = 0, g_dropped_clients = 0, g_lagged = 0;

static bool valid_name(std::string_view s) {
    if (s.empty() || s.size() > 128) return false;
    for (char c : s) {
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '-' || c == '.' || c == ':' || c == '@';
        if (!ok) return false;
    }
    return true;
}

static std::string stats_json() {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "{\"subscribers\":%lld,\"channels\":%zu,\"published\":%lld,\"dropped_slow_clients\":%lld,"
                  "\"lagged_messages\":%lld}",
                  g_subscribers, g_seq.size(), g_published, g_dropped_clients, g_lagged);
    return buf;
}

// Like gorilla-hub: log the counters on SIGTERM/SIGINT, then exit.
static void on_signal(int) {
    std::string s = HUB_NAME " stats " + stats_json() + "\n";
    ssize_t r = write(2, s.data(), s.size());
    (void) r;
    _exit(0);
}

int main(int argc, char **argv) {
#ifdef UWS_HUB_TLS
    TlsArgs args = parse_tls_args(argc, argv, HUB_NAME);
    const Addr &addr = args.addr;
#else
    Addr addr = parse_addr_args(argc, argv, HUB_NAME);
#endif
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);

#ifdef UWS_HUB_TLS
    uWS::SocketContextOptions tls = {};
    tls.key_file_name = args.key.c_str();
    tls.cert_file_name = args.cert.c_str();
    uWS::SSLApp app(tls);
    if (app.constructorFailed()) {
        std::fprintf(stderr, HUB_NAME ": cannot load the certificate %s / key %s (PEM)\n", args.cert.c_str(),
                     args.key.c_str());
        return 1;
    }
#else
    uWS::App app;
#endif
    app.ws<Sub>("/ws/:channel", {
            .compression = HUB_COMPRESSION,
            .maxPayloadLength = 64 * 1024,
            .idleTimeout = 120,
            .maxBackpressure = 64 * 1024,
            .closeOnBackpressureLimit = false,
            .resetIdleTimeoutOnSend = false,
            .sendPingsAutomatically = true,
            .upgrade = [](auto *res, auto *req, auto *ctx) {
                std::string_view name = req->getParameter(0);
                if (!valid_name(name)) {
                    res->writeStatus("400 Bad Request")->end("bad channel name");
                    return;
                }
                res->template upgrade<Sub>({std::string(name)}, req->getHeader("sec-websocket-key"),
                                           req->getHeader("sec-websocket-protocol"),
                                           req->getHeader("sec-websocket-extensions"), ctx);
            },
            .open = [](auto *ws) {
                const std::string &ch = ws->getUserData()->channel;
                g_seq.try_emplace(ch, 0);
                ws->subscribe(ch);
                g_subscribers++;
            },
            .message = [](auto *, std::string_view, uWS::OpCode) {},  // subscribers send nothing
            .dropped = [](auto *, std::string_view, uWS::OpCode) { g_lagged++; },
            .close = [](auto *, int, std::string_view) { g_subscribers--; },
        })
        .post("/api/publish/:channel", [&app](auto *res, auto *req) {
            std::string channel(req->getParameter(0));
            if (!valid_name(channel)) {
                res->writeStatus("400 Bad Request")->end("bad channel name");
                return;
            }
            bool binary = req->getHeader("content-type").rfind("text/", 0) != 0;
            auto aborted = std::make_shared<bool>(false);
            res->onAborted([aborted]() { *aborted = true; });
            res->onData([res, &app, aborted, channel = std::move(channel), binary,
                         body = std::string(), too_big = false](std::string_view chunk, bool last) mutable {
                if (*aborted) return;
                if (!too_big) {
                    if (body.size() + chunk.size() > kMaxPublish) {
                        too_big = true;
                        body.clear();
                    } else {
                        body.append(chunk);
                    }
                }
                if (!last) return;
                if (too_big) {
                    res->writeStatus("413 Payload Too Large")->end("body too large");
                    return;
                }
                uint64_t seq = ++g_seq[channel];
                g_published++;
                app.publish(channel, body, binary ? uWS::OpCode::BINARY : uWS::OpCode::TEXT, HUB_COMPRESS_PUBLISH);
                char out[40];
                int n = std::snprintf(out, sizeof out, "{\"seq\":%llu}", (unsigned long long) seq);
                res->writeHeader("Content-Type", "application/json")->end(std::string_view(out, (size_t) n));
            });
        })
        .get("/api/stats", [](auto *res, auto *) {
            res->writeHeader("Content-Type", "application/json")->end(stats_json());
        })
        .get("/healthz", [](auto *res, auto *) { res->end("ok"); })
        .listen(addr.host, addr.port, [&](auto *ls) {
            if (!ls) {
                std::fprintf(stderr, HUB_NAME ": cannot listen on %s:%d\n", addr.host.c_str(), addr.port);
                std::exit(1);
            }
#ifdef UWS_HUB_TLS
            std::fprintf(stderr, HUB_NAME " listening on %s:%d (TLS, %s)\n", addr.host.c_str(), addr.port,
                         OpenSSL_version(OPENSSL_VERSION));
#else
            std::fprintf(stderr, HUB_NAME " listening on %s:%d\n", addr.host.c_str(), addr.port);
#endif
        })
        .run();
    return 0;
}
