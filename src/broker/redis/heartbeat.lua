-- throng: a node's heartbeat. Records the node's beat in the nodes' set, on
-- this Redis' clock (so the nodes' clocks need not agree), forgets nodes gone
-- for long, and lists the gone ones.
-- KEYS[1] the nodes (a sorted set, node -> its last beat, unix ms)
-- ARGV[1] this node   ARGV[2] the node TTL (ms): an older beat is a gone node
-- ARGV[3] after how long (ms) a gone node is forgotten
-- Returns the gone nodes, oldest first (never this one, which just beat).
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - tonumber(ARGV[3])))
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - tonumber(ARGV[2])))
