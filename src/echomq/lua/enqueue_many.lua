--[[ enqueue_many: admit many jobs in one call; one verdict per job, in input order.
  KEYS[1] meta      HASH  emq:{q}:meta   (pins the queue's slot for the base)
  ARGV[1] base            emq:{q}:
  ARGV[2] group           lane name, or '' for the flat set
  ARGV[3] mode            now | in | at
  ARGV[4] value           ms for 'in' / 'at'
  ARGV[5] replay_ms       how long a resend of this call may still come (0: none)
  ARGV[6] nonce           the call's nonce, the same on every resend ('' : none)
  ARGV[7..] id, payload, id, payload, ...
  Returns {verdict, ...}: 'enqueued' | 'scheduled' | 'duplicate' | 'replayed' |
    'replayed:scheduled' | 'kind' per job ('replayed': a resend whose first copy landed, see
    admit.lua). An id named twice in one call: the Python side sends it once.
  Flags: writes once
]]
--@include common
--@include admit
local base = ARGV[1]
local g = ARGV[2]
if g == '' then g = false end
local now = now_ms()
local run_at = run_time(ARGV[3], ARGV[4], now)
local replay_ms, nonce = tonumber(ARGV[5]), ARGV[6]
local out, marks = {}, {}
local added = 0
for i = 7, #ARGV, 2 do
  local id = ARGV[i]
  local verdict = replayed(base, id, nonce, now)
  if not verdict then verdict = admit(base, id, ARGV[i + 1], g, run_at, now) end
  if verdict == 'enqueued' then added = added + 1 end
  if replay_ms > 0 and nonce ~= '' and (verdict == 'enqueued' or verdict == 'scheduled') then
    marks[#marks + 1] = marker(id, nonce, verdict)
  end
  out[#out + 1] = verdict
end
-- After the admissions: the first write of the call is a row's HSET (see admit.lua).
forget_expired(base, nonce, now)
-- One ring/registry sync for the whole batch: every job went to the same waiting set.
if added > 0 then touch(base, g, added) end
if #marks > 0 then remember(base, marks, now + replay_ms) end
return out
