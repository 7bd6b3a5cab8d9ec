--[[ extend: push a held lease to now + lease_ms (server clock). Fenced (D5).
  KEYS[1] active    ZSET  emq:{q}:active
  KEYS[2] row       HASH  emq:{q}:job:<id>
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  ARGV[3] token
  ARGV[4] lease_ms        > 0
  Returns 1 | 0 when gone | error EMQSTALE
  A heartbeat is never refused for memory (allow-oom, protocol/scripts.py): it only moves scores.
  Flags: writes replay allow-oom
  Native: EMQ.EXTEND args=4
]]
--@include common
--@include args
--@include fence
shape(2, 4, 4, 'ERR EMQ.EXTEND takes 2 keys (active, row) and 4 args (extend) or 1 key (active) and at least 2 args (extend_many)')
local lease_ms = int_arg(ARGV[4])
local base, id = ARGV[1], ARGV[2]
local row, err = fence(KEYS[2], ARGV[3], 'extend')
if err then return redis.error_reply(err) end
if not row then return 0 end
rearm(base, id, KEYS[2], row, now_ms() + lease_ms)
return 1
