--[[ enqueue_many: admit many jobs in one call; one verdict per job, in input order.
  KEYS[1] meta      HASH  emq:{q}:meta   (pins the queue's slot for the base)
  ARGV[1] base            emq:{q}:
  ARGV[2] group           lane name, or '' for the flat set
  ARGV[3] mode            now | in | at
  ARGV[4] value           ms for 'in' / 'at'
  ARGV[5..] id, payload, id, payload, ...
  Returns {verdict, ...}: 'enqueued' | 'scheduled' | 'duplicate' | 'kind' per job
]]
--@include common
--@include admit
local base = ARGV[1]
local g = ARGV[2]
if g == '' then g = false end
local now = now_ms()
local run_at = run_time(ARGV[3], ARGV[4], now)
local out = {}
local added = 0
for i = 5, #ARGV, 2 do
  local verdict = admit(base, ARGV[i], ARGV[i + 1], g, run_at, now)
  if verdict == 'enqueued' then added = added + 1 end
  out[#out + 1] = verdict
end
-- One ring/registry sync for the whole batch: every job went to the same waiting set.
if added > 0 then touch(base, g, added) end
return out
