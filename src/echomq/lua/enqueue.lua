--[[ enqueue: -> pending (or its lane), or -> schedule when delayed. Idempotent by id.
  KEYS[1] row       HASH  emq:{q}:job:<id>
  KEYS[2] meta      HASH  emq:{q}:meta   (pins the queue's slot for the base)
  ARGV[1] base            emq:{q}:
  ARGV[2] id              a branded id; only JOB ids are admitted (EMQKIND)
  ARGV[3] payload         opaque bytes, stored verbatim
  ARGV[4] group           lane name, or '' for the flat set
  ARGV[5] mode            now | in | at
  ARGV[6] value           ms: a delay for 'in', an absolute unix ms for 'at'
  ARGV[7] replay_ms       optional: how long a resend of this call may still come (0: none)
  ARGV[8] nonce           optional: the call's nonce, the same on every resend ('' : none)
  ARGV[9] dedup           optional: a dedup id (D20, include/control.lua); '' : none
  ARGV[10] dedup_mode     simple | throttle | debounce
  ARGV[11] dedup_ttl_ms   the key's TTL (throttle, debounce); 0 for simple
  Returns 'enqueued' | 'scheduled' | 'duplicate' | 'replayed' / 'replayed:scheduled' (a
    resend whose first copy landed, and what that copy answered) | 'deduplicated:<holder id>'
    | error EMQKIND
  Flags: writes once
]]
--@include common
--@include admit
--@include control
local base, id = ARGV[1], ARGV[2]
local g = ARGV[4]
if g == '' then g = false end
local replay_ms, nonce = tonumber(ARGV[7] or '0'), ARGV[8] or ''
local did = ARGV[9] or ''
-- The clock is read only when the job has a run time (D10: server clock for 'in') or a
-- replay marker (admit.lua).
local now = 0
if ARGV[5] ~= 'now' or nonce ~= '' or did ~= '' then now = now_ms() end
-- Policy first (admit checks it too): a refused call writes nothing, not even an expiry.
local KIND = 'EMQKIND job id must be JOB-namespaced'
if string.sub(id, 1, 3) ~= 'JOB' then return redis.error_reply(KIND) end
local again = replayed(base, id, nonce, now)
if again then
  forget_expired(base, nonce, now)
  return again
end
local run_at = run_time(ARGV[5], ARGV[6], now)
if did ~= '' then
  local holder = dedup_holder(base, did, ARGV[10], ARGV[3], run_at, now)
  if holder then return 'deduplicated:' .. holder end
end
local verdict = admit(base, id, ARGV[3], g, run_at, now)
if verdict == 'kind' then return redis.error_reply(KIND) end
if did ~= '' and verdict ~= 'duplicate' then take_dedup(base, id, did, tonumber(ARGV[11])) end
forget_expired(base, nonce, now)
if verdict == 'enqueued' then touch(base, g, 1) end
if replay_ms > 0 and nonce ~= '' and verdict ~= 'duplicate' then
  remember(base, {marker(id, nonce, verdict)}, now + replay_ms)
end
return verdict
