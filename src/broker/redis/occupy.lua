-- throng: this node has subscribers of a channel whose occupancy is watched
-- (Pusher's channel_occupied); the node that makes it occupied says so, once for
-- the cluster. Gone nodes are taken out first.
-- KEYS[1] the channel's occupants (a set of nodes)
-- ARGV[1] this node   ARGV[2...] the gone nodes (last beat older than the node TTL)
-- Returns 1 when the channel was empty before, 2 when only gone nodes held it
-- (it was vacated unseen, and is occupied again), 0 otherwise.
local dead = 0
for i = 2, #ARGV do
  dead = dead + redis.call('SREM', KEYS[1], ARGV[i])
end
if redis.call('SADD', KEYS[1], ARGV[1]) == 1 and redis.call('SCARD', KEYS[1]) == 1 then
  if dead > 0 then
    return 2
  end
  return 1
end
return 0
