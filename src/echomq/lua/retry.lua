--[[ retry: active -> schedule after delay_ms, or -> dead at the attempt ceiling. Fenced.
  KEYS[1] active    ZSET  emq:{q}:active
  KEYS[2] schedule  ZSET  emq:{q}:schedule
  KEYS[3] dead      ZSET  emq:{q}:dead
  KEYS[4] row       HASH  emq:{q}:job:<id>
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  ARGV[3] token
  ARGV[4] delay_ms        >= 0, on the server clock
  ARGV[5] max_attempts    the ceiling, compared with the row's cumulative attempts
  ARGV[6] error           kept as last_error
  Returns 'scheduled' | 'dead' | 0 when gone | error EMQSTALE
]]
--@include common
--@include fence
local base, id = ARGV[1], ARGV[2]
local jk = KEYS[4]
local row, err = fence(jk, ARGV[3], 'retry')
if err then return redis.error_reply(err) end
if not row then return 0 end
release(base, id, jk, row)
rcall('HSET', jk, 'last_error', ARGV[6])
if tonumber(row[1]) >= tonumber(ARGV[5]) then
  rcall('HSET', jk, 'state', 'dead')
  rcall('ZADD', KEYS[3], 0, id)
  rcall('HINCRBY', base .. 'metrics:failed', 'count', 1)
  return 'dead'
end
rcall('HSET', jk, 'state', 'scheduled')
rcall('ZADD', KEYS[2], now_ms() + tonumber(ARGV[4]), id)
return 'scheduled'
