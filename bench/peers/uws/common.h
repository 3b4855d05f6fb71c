// Shared helpers for the uWebSockets benchmark peers: --addr parsing.
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
