--[[ claim_batch: up to n jobs pending -> active on one shared lease; lanes served fairly.
  KEYS[1] meta      HASH  emq:{q}:meta   (the pause flag is read here, inside the script)
  KEYS[2] ring      LIST  emq:{q}:ring
  KEYS[3] active    ZSET  emq:{q}:active
  ARGV[1] base            emq:{q}:
  ARGV[2] lease_ms        > 0
  ARGV[3] n               > 0
  Returns {{id, payload, attempts, group|nil}, ...} (possibly empty), in claim order; {ms}
    when it claimed nothing because a rate limit holds jobs back (D21, include/lease.lua)
  Flags: writes replay
  Native: EMQ.CLAIM args=3
]]
--@include common
--@include args
--@include control
--@include compose
--@include lease
--@cold expire_job
shape(3, 3, 3, 'ERR EMQ.CLAIM takes 3 keys (meta, ring, active) and 2 args (claim) or 3 keys (meta, ring, active) and 3 args (claim_batch)')
local lease_ms, want = int_arg(ARGV[2]), int_arg(ARGV[3])
if claim_gate(ARGV[1]) then return {} end
local out = {}
local now = now_ms()
claim_n(ARGV[1], now + lease_ms, want, out, now)
if #out == 0 then
  local wait = rate_wait(ARGV[1], now)
  if wait > 0 then return {wait} end
end
return out
