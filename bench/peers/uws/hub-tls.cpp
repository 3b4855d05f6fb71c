// uws-hub-tls: uws-hub (hub.cpp) on uWS::SSLApp: the same fan-out server and
// HTTP API (WebSocket /ws/{channel} subscribes, POST /api/publish/{channel}
// publishes and answers {"seq":N}, GET /api/stats, GET /healthz), over wss:// /
// https://, TLS terminated by the server itself through uSockets' OpenSSL layer
// (built with -DLIBUS_USE_OPENSSL, linked to the system libssl/libcrypto), with
// uSockets' TLS defaults, as uws-echo-tls (echo-tls.cpp).
//
// Usage: uws-hub-tls --cert CERT.pem --key KEY.pem [--addr 127.0.0.1:8080]
//        uws-hub-tls --version   (the OpenSSL it runs with)
#define UWS_HUB_TLS 1
#include "hub.cpp"
