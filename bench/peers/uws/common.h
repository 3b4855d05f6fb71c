// Shared helpers for the uWebSockets benchmark peers: --addr parsing, and for
// the TLS peers (built with -DLIBUS_USE_OPENSSL) --cert / --key / --version.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

struct Addr {
    std::string host = "127.0.0.1";
    int port = 8080;
};

// Accepts --addr HOST:PORT, -addr HOST:PORT and --addr=HOST:PORT (like the other peers).
static Addr parse_addr_args(int argc, char **argv, const char *prog) {
    Addr a;
    std::string v;
    for (int i = 1; i < argc; i++) {
        std::string arg = argv[i];
        if ((arg == "--addr" || arg == "-addr") && i + 1 < argc) {
            v = argv[++i];
        } else if (arg.rfind("--addr=", 0) == 0) {
            v = arg.substr(7);
        } else {
            std::fprintf(stderr, "unknown argument %s; usage: %s [--addr HOST:PORT]\n", arg.c_str(), prog);
            std::exit(2);
        }
    }
    if (!v.empty()) {
        size_t colon = v.rfind(':');
        if (colon == std::string::npos) {
            std::fprintf(stderr, "%s: --addr needs HOST:PORT, got %s\n", prog, v.c_str());
            std::exit(2);
        }
        a.host = v.substr(0, colon);
        a.port = std::atoi(v.c_str() + colon + 1);
        if (a.port <= 0 || a.port > 65535) {
            std::fprintf(stderr, "%s: bad port in %s\n", prog, v.c_str());
            std::exit(2);
        }
    }
    return a;
}

#ifdef LIBUS_USE_OPENSSL
#include <openssl/crypto.h>
#include <openssl/opensslv.h>

#include <vector>

struct TlsArgs {
    std::string cert, key;  // PEM files (the cert file may hold a chain)
    Addr addr;
};

// For the TLS peers: --cert FILE and --key FILE (also -cert, --cert=FILE, ...)
// are required, --addr as above; --version prints the OpenSSL it runs with and exits.
static TlsArgs parse_tls_args(int argc, char **argv, const char *prog) {
    TlsArgs t;
    // Take --cert / --key (and --version) out; the rest (--addr) goes to parse_addr_args.
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
            dst = s == "cert" ? &t.cert : &t.key;
            break;
        }
        if (dst) {
            *dst = val;
        } else if (arg == "--version" || arg == "-version") {
            std::printf("%s (built with %s)\n", OpenSSL_version(OPENSSL_VERSION), OPENSSL_VERSION_TEXT);
            std::exit(0);
        } else {
            rest.push_back(argv[i]);
        }
    }
    if (t.cert.empty() || t.key.empty()) {
        std::fprintf(stderr, "usage: %s --cert CERT.pem --key KEY.pem [--addr HOST:PORT]\n", prog);
        std::exit(2);
    }
    t.addr = parse_addr_args((int) rest.size(), rest.data(), prog);
    return t;
}
#endif
