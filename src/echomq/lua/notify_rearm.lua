--[[ notify_rearm: put back the wake token a result waiter took (D17), so the one push of the
  settling script wakes every waiter of the job, in every process (include/control.lua).
  KEYS[1] notify    LIST  emq:{q}:notify:<id>
  KEYS[2] result    HASH  emq:{q}:result:<id>
  Returns 1 | 0 when the result has expired (nothing to wake anyone for)
  Flags: writes replay
]]
local rcall = redis.call
local ttl = rcall('PTTL', KEYS[2])
if ttl <= 0 then return 0 end
-- One token at most: a resend after a lost reply adds nothing.
if rcall('LLEN', KEYS[1]) == 0 then
  rcall('RPUSH', KEYS[1], '1')
  rcall('PEXPIRE', KEYS[1], ttl)
end
return 1
