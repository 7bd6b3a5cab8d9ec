--[[ enqueue: -> pending (or its lane), or -> schedule when delayed. Idempotent by id.
  KEYS[1] row       HASH  emq:{q}:job:<id>
  KEYS[2] meta      HASH  emq:{q}:meta   (pins the queue's slot for the base)
  ARGV[1] base            emq:{q}:
  ARGV[2] id              a branded id; only JOB ids are admitted (EMQKIND)
  ARGV[3] payload         opaque bytes, stored verbatim
  ARGV[4] group           lane name, or '' for the flat set
  ARGV[5] mode            now | in | at
  ARGV[6] value           ms: a delay for 'in', an absolute unix ms for 'at'
  Returns 'enqueued' | 'scheduled' | 'duplicate' | error EMQKIND
]]
--@include common
--@include admit
local base, id = ARGV[1], ARGV[2]
local g = ARGV[4]
if g == '' then g = false end
local now = now_ms()
local verdict = admit(base, id, ARGV[3], g, run_time(ARGV[5], ARGV[6], now), now)
if verdict == 'kind' then return redis.error_reply('EMQKIND job id must be JOB-namespaced') end
if verdict == 'enqueued' then touch(base, g, 1) end
return verdict
