// uws-echo-tls: uws-echo (echo.cpp) on uWS::SSLApp: the same WebSocket echo
// (any path, same opcode back, compression off, 64 KiB max message, idle
// timeout 120 s with automatic pings, GET /healthz -> ok), but TLS is terminated
// by the server itself, through uSockets' OpenSSL layer (built with
// -DLIBUS_USE_OPENSSL, linked to the system libssl/libcrypto). uSockets' TLS
// defaults apply: TLS 1.2 minimum, OpenSSL's default ciphers, groups and
// session resumption (server session cache and session tickets, TLS 1.2 and
// 1.3), no ALPN selection.
//
// Usage: uws-echo-tls --cert CERT.pem --key KEY.pem [--addr 127.0.0.1:8080]
//        uws-echo-tls --version   (the OpenSSL it runs with)
#include "App.h"
#include "common.h"

struct Conn {};  // no per-connection state

int main(int argc, char **argv) {
    const char *prog = "uws-echo-tls";
    TlsArgs args = parse_tls_args(argc, argv, prog);
    const std::string &cert = args.cert, &key = args.key;
    const Addr &addr = args.addr;

    uWS::SocketContextOptions tls = {};
    tls.key_file_name = key.c_str();
    tls.cert_file_name = cert.c_str();
    uWS::SSLApp app(tls);
    if (app.constructorFailed()) {
        std::fprintf(stderr, "%s: cannot load the certificate %s / key %s (PEM)\n", prog, cert.c_str(), key.c_str());
        return 1;
    }
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
                std::fprintf(stderr, "%s: cannot listen on %s:%d\n", prog, addr.host.c_str(), addr.port);
                std::exit(1);
            }
            std::fprintf(stderr, "%s listening on %s:%d (TLS, %s)\n", prog, addr.host.c_str(), addr.port,
                         OpenSSL_version(OPENSSL_VERSION));
        })
        .run();
    return 0;
}
