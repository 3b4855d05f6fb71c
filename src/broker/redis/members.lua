-- throng: adds a delta to this node's members of a channel and returns the sum
-- over the nodes, taking out the gone ones.
-- KEYS[1] the channel's members (a hash, node -> its subscribers)
-- ARGV[1] this node   ARGV[2] the delta ('0': only count)   ARGV[3] key life (seconds)
-- ARGV[4...] the gone nodes (last beat older than the node TTL); a node not
-- named counts, however new
-- Returns the total (negative counts count as 0).
local gone = {}
for i = 4, #ARGV do
  gone[ARGV[i]] = true
end
if ARGV[2] ~= '0' then
  redis.call('HINCRBY', KEYS[1], ARGV[1], tonumber(ARGV[2]))
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
end
local all = redis.call('HGETALL', KEYS[1])
local total = 0
for i = 1, #all, 2 do
  if gone[all[i]] then
    redis.call('HDEL', KEYS[1], all[i])
  else
    total = total + math.max(tonumber(all[i + 1]), 0)
  end
end
return total
