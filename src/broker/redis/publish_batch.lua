-- throng: publish many messages in one run, each as publish.lua would (its text
-- is this script's throng_publish_one, with origin.lua before it): one round
-- trip and one INFO replication for all of them. Not on a Redis Cluster (one
-- script's keys are in one slot) and not with --redis-wait-replicas (each
-- message's WAIT is its own).
-- KEYS: publish.lua's 6 per message, message after message.
-- ARGV[1] how many messages; then publish.lua's 12 ARGV per message, in turn.
-- Returns one answer per message, in order: publish.lua's {seq, epoch, stamp,
-- how}, or {-1, why} for a message Redis refused (the others still go: each
-- runs under its own pcall, and a refused one wrote nothing before its error
-- unless Redis itself failed mid-way, e.g. out of memory).
local n = tonumber(ARGV[1])
local answers = {}
for i = 0, n - 1 do
  local keys = {}
  for j = 1, 6 do keys[j] = KEYS[i * 6 + j] end
  local args = {}
  for j = 1, 12 do args[j] = ARGV[1 + i * 12 + j] end
  local ok, answer = pcall(throng_publish_one, keys, args)
  if not ok then
    if type(answer) == 'table' then answer = answer.err or 'error' end
    answer = tostring(answer)
    -- A replica (a demoted master) refuses every write, this message's first:
    -- nothing of the run was written, and the node must hear it to look for
    -- the new master.
    if string.find(answer, 'READONLY', 1, true) then return redis.error_reply(answer) end
    answers[i + 1] = {-1, answer}
  elseif type(answer) == 'table' and answer.err then
    answers[i + 1] = {-1, answer.err}
  else
    answers[i + 1] = answer
  end
end
return answers
