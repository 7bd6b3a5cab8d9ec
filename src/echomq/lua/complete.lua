--[[ complete: active (or pending after a reap, D5) -> done; token-fenced; deletes the row.
  KEYS[1] active    ZSET  emq:{q}:active
  KEYS[2] row       HASH  emq:{q}:job:<id>
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  ARGV[3] token           the attempts value claim returned
  ARGV[4] result          accepted for the API's sake; the row is retired, nothing keeps it
  Returns 1 | 0 when gone | error EMQSTALE
]]
--@include common
--@include fence
local base, id = ARGV[1], ARGV[2]
local row, err = fence(KEYS[2], ARGV[3], 'complete')
if err then return redis.error_reply(err) end
if not row then return 0 end
release(base, id, KEYS[2], row)
-- The logs go with the row: once the row is gone no verb can read them, so keeping them
-- would only leak memory.
rcall('DEL', KEYS[2], KEYS[2] .. ':logs')
rcall('HINCRBY', base .. 'metrics:completed', 'count', 1)
return 1
