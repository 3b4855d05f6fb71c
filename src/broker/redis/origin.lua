-- throng: whether a channel's stored history is still the history its seqs were
-- handed out from. Prepended to publish.lua and snapshot.lua (one text each).
-- The epoch key holds 'EPOCH:ORIGIN:W': ORIGIN the replication id of the Redis
-- that last wrote it, W 'w' when that node WAITs for replicas before answering.
-- Redis replicates asynchronously: a promoted replica (or a restarted Redis) may
-- lack the last acknowledged publishes, and must not hand out their seqs again.

-- This Redis' replication ids (INFO once per script run).
local throng_ids
local function throng_replication()
  if not throng_ids then
    local info = redis.call('INFO', 'replication')
    throng_ids = {string.match(info, 'master_replid:(%w+)'), string.match(info, 'master_replid2:(%w+)') or ''}
  end
  return throng_ids[1], throng_ids[2]
end

-- Whether the channel's epoch (stored: its epoch key) still holds.
-- Returns the epoch to keep, or false when the channel must start a new one.
-- durable: the replication id of the Redis the node found appending every write
-- to disk before answering (appendonly yes, appendfsync always), '' for none; it
-- speaks for this Redis only while that id is this Redis' own (a restart makes a
-- new one).
local function throng_kept_epoch(stored, durable)
  if not stored then return false end
  local epoch, origin, waited = string.match(stored, '^(%x+):?([%w]*):?(%a*)$')
  if not epoch then return false end
  -- Written before throng recorded origins: nothing to compare.
  if origin == '' then return epoch end
  local replid, replid2 = throng_replication()
  if origin == replid then return epoch end
  -- A replica promoted from the writer's: it has that write if a replica
  -- acknowledged it (WAIT) before the publisher was answered.
  if origin == replid2 and waited == 'w' then return epoch end
  -- A restart (never a replica since: no second id) of a Redis that kept every
  -- acknowledged write on disk.
  if durable == replid and string.match(replid2, '^0+$') then return epoch end
  return false
end

local function throng_replid()
  return (throng_replication())
end
