--[[ repeat_remove: unregister a repeatable job (D19); occurrences already enqueued stay.
  KEYS[1] repeat    ZSET  emq:{q}:repeat
  KEYS[2] spec      HASH  emq:{q}:repeat:<name>
  KEYS[3] free      LIST  emq:{q}:repeatfree    (its slot goes back here for the next name)
  ARGV[1] name
  Returns 1 when it was registered, else 0
  Flags: writes replay
]]
local rcall = redis.call
local slot = rcall('HGET', KEYS[2], 'slot')
if slot then rcall('RPUSH', KEYS[3], slot) end
local removed = rcall('ZREM', KEYS[1], ARGV[1])
removed = removed + rcall('DEL', KEYS[2])
if removed > 0 then return 1 end
return 0
