--[[ complete: active (or pending after a reap, D5) -> done; token-fenced; deletes the row.
  KEYS[1] active    ZSET  emq:{q}:active
  KEYS[2] row       HASH  emq:{q}:job:<id>
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  ARGV[3] token           the attempts value claim returned
  ARGV[4] result          accepted for the API's sake; the row is retired, nothing keeps it
  Returns 1 | 0 when gone | error EMQSTALE
  Flags: writes once
]]
--@include common
--@include fence
--@include settle
local base = ARGV[1]
local verdict = complete_one(base, ARGV[2], KEYS[2], ARGV[3])
if type(verdict) == 'string' then return redis.error_reply(verdict) end
if verdict == 1 then rcall('HINCRBY', base .. 'metrics:completed', 'count', 1) end
return verdict
