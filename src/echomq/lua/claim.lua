--[[ claim: pending (flat or a lane) -> active; mints the fencing token (attempts). D4.
  KEYS[1] meta      HASH  emq:{q}:meta   (the pause flag is read here, inside the script)
  KEYS[2] ring      LIST  emq:{q}:ring
  KEYS[3] active    ZSET  emq:{q}:active
  ARGV[1] base            emq:{q}:
  ARGV[2] lease_ms        > 0
  Returns {id, payload, attempts, group|nil} | {} when paused or nothing is claimable
  Flags: writes replay
]]
--@include common
--@include lease
if rcall('HEXISTS', KEYS[1], 'paused') == 1 then return {} end
local out = {}
claim_n(ARGV[1], now_ms() + tonumber(ARGV[2]), 1, out)
return out[1] or {}
