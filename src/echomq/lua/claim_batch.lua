--[[ claim_batch: up to n jobs pending -> active on one shared lease; lanes served fairly.
  KEYS[1] meta      HASH  emq:{q}:meta   (the pause flag is read here, inside the script)
  KEYS[2] ring      LIST  emq:{q}:ring
  KEYS[3] active    ZSET  emq:{q}:active
  ARGV[1] base            emq:{q}:
  ARGV[2] lease_ms        > 0
  ARGV[3] n               > 0
  Returns {{id, payload, attempts, group|nil}, ...} (possibly empty), in claim order
]]
--@include common
--@include lease
local base = ARGV[1]
if rcall('HEXISTS', KEYS[1], 'paused') == 1 then return {} end
local deadline = now_ms() + tonumber(ARGV[2])
local out = {}
for _ = 1, tonumber(ARGV[3]) do
  local job = claim_one(base, deadline)
  if not job then break end
  out[#out + 1] = job
end
return out
