-- throng: a node no longer has subscribers of a watched channel (it left, or it
-- is gone and another node sweeps for it); the node that empties the channel
-- says so (Pusher's channel_vacated), once for the cluster.
-- KEYS[1] the channel's occupants (a set of nodes)   ARGV[1] the node leaving
-- Returns 1 when the channel is now empty, 0 otherwise.
if redis.call('SREM', KEYS[1], ARGV[1]) == 1 and redis.call('SCARD', KEYS[1]) == 0 then
  return 1
end
return 0
