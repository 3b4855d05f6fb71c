// uws-echo: a uWebSockets (uWS::App, one event loop, one thread) echo peer for
// bench/engine.sh. WebSocket on any path: every text/binary message is sent
// back with the same opcode. Compression off, 64 KiB max message, idle timeout
// 120 s with uWS's automatic pings (so idle connections that answer pings stay
// open). GET /healthz answers ok.
//
// Usage: uws-echo [--addr 127.0.0.1:8080]
#include "App.h"
#include "common.h"

struct Conn {};  // no per-connection state

int main(int argc, char **argv) {
    Addr addr = parse_addr_args(argc, argv, "uws-echo");
    uWS::App app;
    app.get("/healthz", [](auto *res, auto * /*req*/) { res->end("ok"); })
        .ws<Conn>("/*", {
            .compression = uWS::DISABLED,
            .maxPayloadLength = 64 * 1024,
            .idleTimeout = 120,
            .maxBackpressure = 1024 * 1024,
            .closeOnBackpressureLimit = false,
            .resetIdleTimeoutOnSend = false,
            .sendPingsAutomatically = true,
            .message = [](auto *ws, std::string_view msg, uWS::OpCode op) { ws->send(msg, op); },
        })
        .listen(addr.host, addr.port, [&](auto *ls) {
            if (!ls) {
                std::fprintf(stderr, "uws-echo: cannot listen on %s:%d\n", addr.host.c_str(), addr.port);
                std::exit(1);
            }
            std::fprintf(stderr, "uws-echo listening on %s:%d\n", addr.host.c_str(), addr.port);
        })
        .run();
    return 0;
}
