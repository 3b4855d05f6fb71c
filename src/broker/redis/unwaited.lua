-- throng: a publish's WAIT came back short (fewer replicas than asked have it):
-- its epoch stamp must not claim otherwise (origin.lua). Unless a later publish
-- has stamped the channel since, the stamp loses its 'w'.
-- KEYS[1] the channel's epoch   ARGV[1] the stamp the publish wrote
-- Returns 1 when the stamp was changed.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], string.gsub(ARGV[1], ':w$', ':'), 'KEEPTTL')
  return 1
end
return 0
