-- throng: publish one message on a channel. Next seq, keep, publish, all in
-- one script so that every node sees one order.
-- KEYS[1] the channel's seq (a counter)   KEYS[2] its epoch   KEYS[3] its history (a stream)
-- KEYS[4] its held messages (a hash)   KEYS[5] its released seq (see release.lua)
-- KEYS[6] the publish's idempotency key (see ARGV[11]; without one, any key of the slot)
-- ARGV[1] the encoded message   ARGV[2] now (unix seconds)   ARGV[3] history size (0: keep none)
-- ARGV[4] key life (seconds)   ARGV[5] a fresh epoch (used if the channel has none)
-- ARGV[6] the pubsub channel   ARGV[7] the magic that marks a node's own messages
-- ARGV[8] the id of the durable Redis, if any (see origin.lua)
-- ARGV[9] 'w' when the node WAITs for replicas after this, '' otherwise. Then
-- the message is held, not kept nor published: release.lua does that once
-- WAIT says the replicas have it.
-- ARGV[10] how many replicas it WAITs for: with fewer linked now, nothing is
-- written (a NOREPLICAS error), as Redis' min-replicas-to-write would. This
-- is what keeps an old master that lost its replica to a promotion (Sentinel
-- names the new one before every node hears of it) from taking publishes.
-- ARGV[11] the idempotency key ('' for none): a key seen on this channel within
-- ARGV[12] seconds names the publish that already happened, and nothing is
-- published again.
-- ARGV[6] is a shard channel (it has a '{', the keys' slot) on a Redis Cluster,
-- where it is SPUBLISHed; PUBLISHed otherwise.
-- Returns {seq, epoch, the epoch key's new value, how}: how 0 for a new
-- publish, 1 for a key seen before (its seq and epoch; nothing written), 2 for
-- a key seen before whose message is still held (the node WAITs and releases it
-- as for a new one). A channel without an epoch, or whose history may have gone
-- back (origin.lua), starts over: seq and history go.
local held = ARGV[9] == 'w'
if held and throng_online_replicas() < tonumber(ARGV[10]) then
  return redis.error_reply('NOREPLICAS fewer replicas linked than --redis-wait-replicas: not published')
end
local keyed = ARGV[11] ~= ''
if keyed then
  local seen = redis.call('GET', KEYS[6])
  local first, at
  if seen then first, at = string.match(seen, '^(%d+):(%x+)$') end
  if first and not held then return {tonumber(first), at, '', 1} end
  if first then
    -- Held mode: the first publish counts only while its epoch holds; held
    -- still, or released (at or below the released seq).
    local stored = redis.call('GET', KEYS[2])
    if stored and string.match(stored, '^(%x+)') == at and throng_kept_epoch(stored, ARGV[8]) then
      if redis.call('HEXISTS', KEYS[4], first) == 1 then
        -- A write, so that the WAIT after this covers the first publish's too.
        redis.call('EXPIRE', KEYS[6], tonumber(ARGV[12]))
        return {tonumber(first), at, '', 2}
      end
      if tonumber(first) <= tonumber(redis.call('GET', KEYS[5]) or '0') then
        return {tonumber(first), at, '', 1}
      end
    end
    -- Its epoch is gone (a failover), or it expired held: published anew.
  end
end
local stored = redis.call('GET', KEYS[2])
local epoch = throng_kept_epoch(stored, ARGV[8])
local kept = epoch
if not epoch then
  epoch = ARGV[5]
  redis.call('DEL', KEYS[1], KEYS[3], KEYS[4], KEYS[5])
end
local seq = redis.call('INCR', KEYS[1])
local life = tonumber(ARGV[4])
local stamp = epoch .. ':' .. throng_replid() .. ':' .. ARGV[9]
redis.call('SET', KEYS[2], stamp, 'EX', life)
redis.call('EXPIRE', KEYS[1], life)
if held then
  -- Everything before the channel's first held message was published.
  redis.call('SET', KEYS[5], seq - 1, 'NX', 'EX', life)
  redis.call('EXPIRE', KEYS[5], life)
  redis.call('HSET', KEYS[4], seq, ARGV[2] .. ' ' .. ARGV[1])
  redis.call('EXPIRE', KEYS[4], life)
  if keyed then redis.call('SET', KEYS[6], seq .. ':' .. epoch, 'EX', tonumber(ARGV[12])) end
  return {seq, epoch, stamp, 0}
end
-- Nodes that held messages here no longer do (their flag changed): what they
-- held was answered as not published, and the seq counts for itself again.
-- Only a held publish leaves them, and it stamps the epoch 'w' (a new epoch
-- deleted them above): otherwise there is nothing to delete.
if kept and string.sub(stored, -2) == ':w' then
  redis.call('DEL', KEYS[4], KEYS[5])
end
local size = tonumber(ARGV[3])
if size > 0 then
  redis.call('XADD', KEYS[3], 'MAXLEN', size, seq .. '-1', 'm', ARGV[1], 't', ARGV[2])
  redis.call('EXPIRE', KEYS[3], life)
end
redis.call(string.find(ARGV[6], '{', 1, true) and 'SPUBLISH' or 'PUBLISH', ARGV[6], ARGV[7] .. 'D' .. seq .. ' ' .. epoch .. '\n' .. ARGV[1])
if keyed then redis.call('SET', KEYS[6], seq .. ':' .. epoch, 'EX', tonumber(ARGV[12])) end
return {seq, epoch, stamp, 0}
