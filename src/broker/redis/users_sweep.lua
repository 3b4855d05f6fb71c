-- throng: takes out of a Pusher presence channel the connections of gone nodes
-- (nodes that died without leaving), removing and announcing each user left
-- with none.
-- KEYS as users_join.lua.   ARGV[1] pubsub channel
-- ARGV[2] what a member_removed message starts with (its data follows)
-- ARGV[3...] the gone nodes (last beat older than the node TTL)
-- Returns the users removed.
-- The pubsub channel is a shard channel (it has a '{', its keys' slot) on a Redis
-- Cluster, where it is SPUBLISHed; PUBLISHed otherwise.
local gone = {}
for i = 3, #ARGV do
  gone[ARGV[i]] = true
end
local all = redis.call('HGETALL', KEYS[3])
local removed = {}
for i = 1, #all, 2 do
  local node, user = string.match(all[i], '^([^\n]*)\n(.*)$')
  if node and gone[node] then
    redis.call('HDEL', KEYS[3], all[i])
    if redis.call('HINCRBY', KEYS[2], user, -tonumber(all[i + 1])) <= 0 then
      redis.call('HDEL', KEYS[2], user)
      if redis.call('HDEL', KEYS[1], user) == 1 then
        redis.call(string.find(ARGV[1], '{', 1, true) and 'SPUBLISH' or 'PUBLISH', ARGV[1], ARGV[2] .. cjson.encode({user_id = user}))
        removed[#removed + 1] = user
      end
    end
  end
end
return removed
