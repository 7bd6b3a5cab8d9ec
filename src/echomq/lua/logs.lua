--[[ logs: the job's log lines, oldest first.
  KEYS[1] row       HASH  emq:{q}:job:<id>
  KEYS[2] logs      LIST  emq:{q}:job:<id>:logs
  Returns {line, ...} | nil when gone
  Flags: reads replay
]]
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
return redis.call('LRANGE', KEYS[2], 0, -1)
