"""What the test modules share, so that no test module imports another.

- `redis.py`: the one single-redis-server launcher (`Redis`: plain, persistent,
  cluster mode alone owning every slot, or a replica of another);
- `sentinel.py`: a master, replicas and a Sentinel (`SentinelSet`) with a
  replication link a test can hold back; `cluster.py`: the 6-process Redis
  Cluster (`RedisCluster`);
- `wait.py`: the one poll-until helper `wait_until(predicate, timeout, what)`,
  and `wait_healthy` (a node's /healthz);
- `streams.py`: SSE (`EventReader`) and long-poll (`poll`) clients;
- `bench.py`: `throng bench` runs and the asserts on their reports;
- `pusher.py`: the Pusher app constants, pusher-js in Node, the Python SDK,
  signed API requests; `webhooks.py`: a webhook endpoint checked by both SDKs;
- `deflate.py`: permessage-deflate payloads, zlib and raw frames;
- `tls.py`: certificates and TLS clients; `nginx.py`: nginx configurations
  (deploy/nginx.conf in front of nodes, the nchan peer);
- `netns.py`: a network namespace joined to this host by a veth pair (a peer
  outside loopback: a remote client, a Redis cut one way);
- `toxiproxy.py`: Toxiproxy over its HTTP API (`Toxiproxy`: a proxy to a Redis,
  latency toxics added and removed while a node runs);
- `fixtures.py`: the shared fixtures (`redis`, `shared_redis`, `prefix`,
  `clients`, `receiver`, `toxiproxy`), registered by conftest.py's `pytest_plugins`.

The throng server itself is started by conftest.py's `start_server` (on port 0,
reading the port the server reports); the raw WebSocket/HTTP client is rawws.py,
the `websockets` wrappers wsutil.py, process helpers procs.py."""
