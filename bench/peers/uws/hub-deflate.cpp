// uws-hub-deflate: uws-hub (hub.cpp) with permessage-deflate: the same fan-out
// server and HTTP API (WebSocket /ws/{channel} subscribes, POST
// /api/publish/{channel} publishes and answers {"seq":N}, GET /api/stats, GET
// /healthz), with `.compression = uWS::SHARED_COMPRESSOR` and every publish sent
// with compress = true. A client that offers permessage-deflate gets it (uWS
// answers e.g. "permessage-deflate; client_no_context_takeover;
// server_no_context_takeover"); uWS then deflates each message for each such
// subscriber with its one shared zlib stream (level Z_DEFAULT_COMPRESSION, reset
// after every message). Clients that do not offer it get plain frames. Built by
// build.sh --deflate with zlib (-lz).
//
// Usage: uws-hub-deflate [--addr 127.0.0.1:8080]
#define UWS_HUB_DEFLATE 1
#include "hub.cpp"
