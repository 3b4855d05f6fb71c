-- throng: this node has subscribers of a channel whose occupancy is watched
-- (Pusher's channel_occupied); the node that makes it occupied says so, once for
-- the cluster. Nodes whose heartbeat key is gone are taken out first.
-- KEYS[1] the channel's occupants (a set of nodes)
-- ARGV[1] this node   ARGV[2] the node key prefix (a node is alive while
-- ARGV[2] .. node exists)
-- Returns 1 when the channel was empty before, 2 when only gone nodes held it
-- (it was vacated unseen, and is occupied again), 0 otherwise.
local dead = 0
for _, node in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if node ~= ARGV[1] and redis.call('EXISTS', ARGV[2] .. node) == 0 then
    redis.call('SREM', KEYS[1], node)
    dead = dead + 1
  end
end
if redis.call('SADD', KEYS[1], ARGV[1]) == 1 and redis.call('SCARD', KEYS[1]) == 1 then
  if dead > 0 then
    return 2
  end
  return 1
end
return 0
