--[[ repeat_pause: pause a repeatable job (issue 26): its spec stays (schedule, payload,
  limits, fired count) with the field `paused` = '1', and its entry moves to +inf, so
  repeat_fire never comes to it (the due scan stops at the server's now, and a cron
  compare-and-set names the old score). A repeat_set of a paused repeat (a worker start
  registering its periodic jobs again) updates the spec and keeps it paused; only
  repeat_resume (or repeat_remove) ends the pause.
  KEYS[1] repeat    ZSET  emq:{q}:repeat        (name -> next fire, server ms)
  KEYS[2] spec      HASH  emq:{q}:repeat:<name>
  ARGV[1] name
  Returns 1 when the repeat is registered (paused now, or it already was) | 0 when no repeat
    has that name (nothing written)
  Flags: writes replay
]]
local rcall = redis.call
local spec = rcall('HMGET', KEYS[2], 'every_ms', 'cron')
if not spec[1] and not spec[2] then return 0 end
rcall('HSET', KEYS[2], 'paused', '1')
rcall('ZADD', KEYS[1], '+inf', ARGV[1])
return 1
