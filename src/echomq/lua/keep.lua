--[[ keep: set or clear a queue's kept-history setting (issue 24, include/history.lua):
  keep_completed keeps completed rows in emq:{q}:completed (scored by their finish time),
  keep_dead bounds the dead set; the scripts that add to a set trim it to the setting.
  KEYS[1] meta      HASH  emq:{q}:meta
  ARGV[1] name            keep_completed | keep_dead
  ARGV[2] value           '<count>:<age_ms>' (either part may be empty: no bound of that
                          kind), or '' to clear (keep_completed: off, completion deletes the
                          row; keep_dead: unbounded)
  Returns 1
  Flags: writes replay
]]
local name, value = ARGV[1], ARGV[2]
if name ~= 'keep_completed' and name ~= 'keep_dead' then
  return redis.error_reply('ERR keep takes keep_completed or keep_dead')
end
if value == '' then
  redis.call('HDEL', KEYS[1], name)
elseif string.match(value, '^%d*:%d*$') then
  redis.call('HSET', KEYS[1], name, value)
else
  return redis.error_reply('ERR keep value must be <count>:<age_ms>')
end
return 1
