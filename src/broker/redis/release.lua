-- throng: with --redis-wait-replicas, a message is held (publish.lua) until
-- WAIT says enough replicas have it; then this publishes it and keeps it in
-- history, with every message held before it (WAIT covers their writes too:
-- they came first), in seq order. Until then no subscriber and no snapshot sees
-- it, so a failover that loses it loses nothing anyone saw, and a promoted
-- replica may hand its seq out again.
-- KEYS[1] the channel's epoch   KEYS[2] its history   KEYS[3] its held messages
-- KEYS[4] its released seq (the last published)
-- ARGV[1] the seq to release up to   ARGV[2] the epoch it was handed out in
-- ARGV[3] history size (0: keep none)   ARGV[4] key life (seconds)
-- ARGV[5] the pubsub channel   ARGV[6] the magic that marks a node's own messages
-- Returns how many it published, or -1 when the channel started a new epoch
-- since (its held messages went with the old one).
local stored = redis.call('GET', KEYS[1])
if not stored or string.match(stored, '^(%x+)') ~= ARGV[2] then return -1 end
local upto = tonumber(ARGV[1])
local from = tonumber(redis.call('GET', KEYS[4]) or '0') + 1
local size = tonumber(ARGV[3])
local life = tonumber(ARGV[4])
local command = string.find(ARGV[5], '{', 1, true) and 'SPUBLISH' or 'PUBLISH'
local published = 0
for seq = from, upto do
  local held = redis.call('HGET', KEYS[3], seq)
  -- Absent only if it expired unreleased: its seq is a gap readers are told of.
  if held then
    local space = string.find(held, ' ', 1, true)
    local message = string.sub(held, space + 1)
    if size > 0 then
      redis.call('XADD', KEYS[2], 'MAXLEN', size, seq .. '-1', 'm', message, 't', string.sub(held, 1, space - 1))
    end
    redis.call(command, ARGV[5], ARGV[6] .. 'D' .. seq .. ' ' .. ARGV[2] .. '\n' .. message)
    redis.call('HDEL', KEYS[3], seq)
    published = published + 1
  end
end
if upto >= from then
  redis.call('SET', KEYS[4], upto, 'EX', life)
  if size > 0 then redis.call('EXPIRE', KEYS[2], life) end
end
return published
