--[[ claim: pending (flat or a lane) -> active; mints the fencing token (attempts). D4.
  KEYS[1] meta      HASH  emq:{q}:meta   (the pause flag is read here, inside the script)
  KEYS[2] ring      LIST  emq:{q}:ring
  KEYS[3] active    ZSET  emq:{q}:active
  ARGV[1] base            emq:{q}:
  ARGV[2] lease_ms        > 0
  Returns {id, payload, attempts, group|nil} | {} when paused or nothing is claimable |
    {ms} when a rate limit holds back what could be claimed: the ms until its window reopens
    (D21, include/lease.lua rate_wait)
  Flags: writes replay
  Native: EMQ.CLAIM args=2
]]
--@include common
--@include args
--@include control
--@include compose
--@include lease
--@cold expire_job
shape(3, 2, 2, 'ERR EMQ.CLAIM takes 3 keys (meta, ring, active) and 2 args (claim) or 3 keys (meta, ring, active) and 3 args (claim_batch)')
local lease_ms = int_arg(ARGV[2])
if claim_gate(ARGV[1]) then return {} end
local out = {}
local now = now_ms()
claim_n(ARGV[1], now + lease_ms, 1, out, now)
if out[1] then return out[1] end
local wait = rate_wait(ARGV[1], now)
if wait > 0 then return {wait} end
return {}
