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

#include <openssl/crypto.h>

#include <vector>

struct Conn {};  // no per-connection state

int main(int argc, char **argv) {
    const char *prog = "uws-echo-tls";
    // Take --cert / --key (and --version) out; the rest (--addr) goes to common.h.
    std::string cert, key;
    std::vector<char *> rest{argv[0]};
    for (int i = 1; i < argc; i++) {
        std::string arg = argv[i];
        std::string *dst = nullptr;
        std::string val;
        for (const char *name : {"cert", "key"}) {
            std::string s = name, dd = "--" + s, d = "-" + s, eq = dd + "=";
            if ((arg == dd || arg == d) && i + 1 < argc) {
                val = argv[++i];
            } else if (arg.rfind(eq, 0) == 0) {
                val = arg.substr(eq.size());
            } else {
                continue;
            }
            dst = s == "cert" ? &cert : &key;
            break;
        }
        if (dst) {
            *dst = val;
        } else if (arg == "--version" || arg == "-version") {
            std::printf("%s (built with %s)\n", OpenSSL_version(OPENSSL_VERSION), OPENSSL_VERSION_TEXT);
            return 0;
        } else {
            rest.push_back(argv[i]);
        }
    }
    if (cert.empty() || key.empty()) {
        std::fprintf(stderr, "usage: %s --cert CERT.pem --key KEY.pem [--addr HOST:PORT]\n", prog);
        return 2;
    }
    Addr addr = parse_addr_args((int) rest.size(), rest.data(), prog);

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
