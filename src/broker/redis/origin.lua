-- throng: whether a channel's stored history is still the history its seqs were
-- handed out from. Prepended to publish.lua and snapshot.lua (one text each).
-- The epoch key holds 'EPOCH:ORIGIN:W': ORIGIN the replication id of the Redis
-- that last wrote it, W 'w' when that node WAITs for replicas before answering.
-- Redis replicates asynchronously: a promoted replica (or a restarted Redis) may
-- lack the last acknowledged publishes, and must not hand out their seqs again.

-- This Redis' INFO replication (asked once per script run).
local throng_info
local function throng_replication_info()
  if not throng_info then throng_info = redis.call('INFO', 'replication') end
  return throng_info
end

-- This Redis' replication ids (read once per script run: a batch asks for
-- them per message).
local throng_replid1, throng_replid2
local function throng_replication()
  if not throng_replid1 then
    local info = throng_replication_info()
    throng_replid1 = string.match(info, 'master_replid:(%w+)')
    throng_replid2 = string.match(info, 'master_replid2:(%w+)') or ''
  end
  return throng_replid1, throng_replid2
end

-- Replicas linked to this Redis now (state=online).
local function throng_online_replicas()
  local n = 0
  for _ in string.gmatch(throng_replication_info(), 'slave%d+:[^\r\n]*state=online') do n = n + 1 end
  return n
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
