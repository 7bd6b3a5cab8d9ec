--[[ drain: delete waiting jobs (the flat set and every lane; the schedule too when asked)
  with their rows and logs. Active jobs survive. Works in budgets: call again while more == 1.
  KEYS[1] pending   ZSET  emq:{q}:pending
  KEYS[2] lanes     SET   emq:{q}:lanes
  ARGV[1] base            emq:{q}:
  ARGV[2] include_schedule  '1' | '0'
  ARGV[3] budget          > 0, jobs deleted per call at most
  Returns {deleted, more}
  Flags: writes once
]]
--@include common
local base = ARGV[1]
local budget = tonumber(ARGV[3])
local deleted = 0
local function empty_set(key)
  while budget > 0 do
    local popped = rcall('ZPOPMIN', key, math.min(budget, 500))
    if #popped == 0 then return end
    for i = 1, #popped, 2 do
      local jk = base .. 'job:' .. popped[i]
      rcall('DEL', jk, jk .. ':logs')
    end
    deleted = deleted + #popped / 2
    budget = budget - #popped / 2
  end
end
empty_set(KEYS[1])
sync(base, false)
for _, g in ipairs(rcall('SMEMBERS', KEYS[2])) do
  empty_set(waiting_key(base, g))
  sync(base, g)
end
if ARGV[2] == '1' then empty_set(base .. 'schedule') end
local more = 0
if budget <= 0 then more = 1 end
return {deleted, more}
