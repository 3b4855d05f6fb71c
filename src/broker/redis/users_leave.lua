-- throng: a connection of a user leaves a Pusher presence channel; its last one
-- (on any node) removes the user and announces it.
-- KEYS as users_join.lua.   ARGV[1] this node   ARGV[2] the user
-- ARGV[3] pubsub channel   ARGV[4] the member_removed message
-- Returns 1 when the user was removed.
-- The pubsub channel is a shard channel (it has a '{', its keys' slot) on a Redis
-- Cluster, where it is SPUBLISHed; PUBLISHed otherwise.
local field = ARGV[1] .. '\n' .. ARGV[2]
if redis.call('HINCRBY', KEYS[3], field, -1) <= 0 then
  redis.call('HDEL', KEYS[3], field)
end
if redis.call('HINCRBY', KEYS[2], ARGV[2], -1) <= 0 then
  redis.call('HDEL', KEYS[2], ARGV[2])
  if redis.call('HDEL', KEYS[1], ARGV[2]) == 1 then
    redis.call(string.find(ARGV[3], '{', 1, true) and 'SPUBLISH' or 'PUBLISH', ARGV[3], ARGV[4])
    return 1
  end
end
return 0
