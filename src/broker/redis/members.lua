-- throng: adds a delta to this node's members of a channel and returns every
-- live node's sum, forgetting nodes whose heartbeat key is gone.
-- KEYS[1] the channel's members (a hash, node -> its subscribers)
-- ARGV[1] this node   ARGV[2] the delta ('0': only count)   ARGV[3] key life (seconds)
-- ARGV[4] the node key prefix (a node is alive while ARGV[4] .. node exists)
-- Returns the total (negative counts count as 0).
if ARGV[2] ~= '0' then
  redis.call('HINCRBY', KEYS[1], ARGV[1], tonumber(ARGV[2]))
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
end
local all = redis.call('HGETALL', KEYS[1])
local total = 0
for i = 1, #all, 2 do
  if all[i] == ARGV[1] or redis.call('EXISTS', ARGV[4] .. all[i]) == 1 then
    total = total + math.max(tonumber(all[i + 1]), 0)
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return total
