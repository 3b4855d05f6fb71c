-- throng: a connection of a user joins a Pusher presence channel. The user is a
-- member while any node holds a connection of it; its first one announces it.
-- KEYS[1] users (user -> user_info)   KEYS[2] user conns (user -> connections)
-- KEYS[3] node conns (node "\n" user -> connections, so a dead node's can go)
-- ARGV[1] this node   ARGV[2] the user   ARGV[3] its user_info   ARGV[4] most users
-- ARGV[5] key life (seconds)   ARGV[6] pubsub channel   ARGV[7] the member_added message
-- Returns {added (1, 0; -1: full, nothing changed), {user, info, ...} before it came}.
-- The pubsub channel is a shard channel (it has a '{', its keys' slot) on a Redis
-- Cluster, where it is SPUBLISHed; PUBLISHed otherwise.
local known = redis.call('HEXISTS', KEYS[1], ARGV[2]) == 1
if not known and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then
  return {-1, {}}
end
local before = redis.call('HGETALL', KEYS[1])
redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
redis.call('HINCRBY', KEYS[3], ARGV[1] .. '\n' .. ARGV[2], 1)
local added = 0
if not known then
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
  redis.call(string.find(ARGV[6], '{', 1, true) and 'SPUBLISH' or 'PUBLISH', ARGV[6], ARGV[7])
  added = 1
end
for i = 1, 3 do
  redis.call('EXPIRE', KEYS[i], tonumber(ARGV[5]))
end
return {added, before}
