--[[ extend: push a held lease to now + lease_ms (server clock). Fenced (D5).
  KEYS[1] active    ZSET  emq:{q}:active
  KEYS[2] row       HASH  emq:{q}:job:<id>
  ARGV[1] base            emq:{q}:
  ARGV[2] id
  ARGV[3] token
  ARGV[4] lease_ms        > 0
  Returns 1 | 0 when gone | error EMQSTALE
  A heartbeat is never refused for memory (allow-oom, _scripts.py): it only moves scores.
  Flags: writes replay allow-oom
]]
--@include common
--@include fence
local base, id = ARGV[1], ARGV[2]
local row, err = fence(KEYS[2], ARGV[3], 'extend')
if err then return redis.error_reply(err) end
if not row then return 0 end
rearm(base, id, KEYS[2], row, now_ms() + tonumber(ARGV[4]))
return 1
