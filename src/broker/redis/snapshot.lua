-- throng: a channel's seq, epoch and kept messages in one instant.
-- KEYS[1] the channel's seq   KEYS[2] its epoch   KEYS[3] its history (a stream)
-- KEYS[4] its held messages   KEYS[5] its released seq (see release.lua)
-- ARGV[1] a fresh epoch   ARGV[2] key life (seconds)
-- ARGV[3] '1' to start the channel (fresh epoch) if it has none, '0' not to
-- ARGV[4] the id of the durable Redis, if any (see origin.lua)
-- Returns {seq, epoch, XRANGE of the history}; {0, false, {}} for a channel that
-- has no epoch and is not to be started. A channel whose history may have gone
-- back (origin.lua) is started afresh when asked to start, and otherwise shown
-- as it is (a reader compares seqs and learns of the new epoch from the next
-- publish).
local stored = redis.call('GET', KEYS[2])
local epoch = throng_kept_epoch(stored, ARGV[4])
if not epoch and stored and ARGV[3] == '0' then
  epoch = string.match(stored, '^(%x+)')
end
if not epoch then
  if ARGV[3] == '0' then return {0, false, {}} end
  epoch = ARGV[1]
  redis.call('DEL', KEYS[1], KEYS[3], KEYS[4], KEYS[5])
  redis.call('SET', KEYS[2], epoch .. ':' .. throng_replid() .. ':', 'EX', tonumber(ARGV[2]))
end
-- Held messages (--redis-wait-replicas) are not there yet: the seq shown is the
-- last one published.
local seq = tonumber(redis.call('GET', KEYS[5]) or redis.call('GET', KEYS[1]) or '0')
return {seq, epoch, redis.call('XRANGE', KEYS[3], '-', '+')}
