--[[ check: the read-only consistency checker (D6). Scans the whole queue in one atomic
  snapshot, so a live queue never shows a torn transition as a violation.
  KEYS[1] meta      HASH  emq:{q}:meta   (pins the queue's slot for the base and the SCANs)
  ARGV[1] base            emq:{q}:   (a glob-safe prefix)
  Returns {violation, ...}; empty when the queue is sound
  Flags: reads replay
]]
--@include common
local base = ARGV[1]
local out = {}
local function bad(s) out[#out + 1] = s end
local STATES = {pending = true, active = true, scheduled = true, dead = true,
  awaiting_children = true}
local where = {}
local by_group = {}

local function scan_keys(pattern, fn)
  local cursor = '0'
  repeat
    local r = rcall('SCAN', cursor, 'MATCH', pattern, 'COUNT', 1000)
    cursor = r[1]
    for _, key in ipairs(r[2]) do fn(key) end
  until cursor == '0'
end

-- Every member of a set: a live row, the state the set means, the lane the row names.
local function members(key, place, expect, lane, zero_scores)
  local m = rcall('ZRANGE', key, 0, -1, 'WITHSCORES')
  for i = 1, #m, 2 do
    local id, score = m[i], m[i + 1]
    if where[id] then
      bad(id .. ' is in two places: ' .. where[id] .. ' and ' .. place)
    else
      where[id] = place
    end
    local row = hmget(base .. 'job:' .. id, 'state', 'group', 'attempts')
    if rcall('EXISTS', base .. 'job:' .. id) == 0 then
      bad(id .. ' in ' .. place .. ' has no row (ghost)')
    elseif not row then
      bad(id .. ' in ' .. place .. ' has a row that is not a hash')
    else
      if row[1] ~= expect then
        bad(id .. ' in ' .. place .. ' has state ' .. tostring(row[1]) .. ', not ' .. expect)
      end
      if lane and row[2] ~= lane then
        bad(id .. ' in ' .. place .. ' has group ' .. tostring(row[2]))
      end
      if place == 'pending' and row[2] then
        bad(id .. ' in the flat pending set has group ' .. row[2])
      end
      if place == 'active' and row[2] then
        by_group[row[2]] = (by_group[row[2]] or 0) + 1
      end
    end
    if zero_scores and tonumber(score) ~= 0 then
      bad(id .. ' in ' .. place .. ' has score ' .. score .. ', not 0')
    end
  end
end

members(base .. 'pending', 'pending', 'pending', nil, true)
members(base .. 'active', 'active', 'active', nil, false)
members(base .. 'schedule', 'schedule', 'scheduled', nil, false)
members(base .. 'dead', 'dead', 'dead', nil, true)

-- Lanes, found by key (not only by the registry, which is itself under test).
local lanes = {}
local lane_prefix = base .. 'g:'
scan_keys(lane_prefix .. '*:pending', function(key)
  local g = string.sub(key, #lane_prefix + 1, -9)
  lanes[g] = true
  members(key, 'lane ' .. g, 'pending', g, true)
end)
for g in pairs(lanes) do
  if rcall('SISMEMBER', base .. 'lanes', g) == 0 then bad('lane ' .. g .. ' is missing from the registry') end
end
for _, g in ipairs(rcall('SMEMBERS', base .. 'lanes')) do
  if not lanes[g] then bad('the registry lists lane ' .. g .. ', which holds no job') end
end

-- The ring holds exactly the serviceable lanes (and FLAT while the flat set is non-empty).
local ring = {}
for _, g in ipairs(rcall('LRANGE', base .. 'ring', 0, -1)) do
  if ring[g] then bad('the ring holds ' .. g .. ' twice') end
  ring[g] = true
  if not serviceable(base, g) then bad('the ring holds ' .. g .. ', which is not serviceable') end
end
if serviceable(base, FLAT) and not ring[FLAT] then bad('the ring misses the flat set') end
for g in pairs(lanes) do
  if serviceable(base, g) and not ring[g] then bad('the ring misses serviceable lane ' .. g) end
end

-- gactive == the lane jobs in active.
local gactive = rcall('HGETALL', base .. 'gactive')
local seen = {}
for i = 1, #gactive, 2 do
  local g, n = gactive[i], tonumber(gactive[i + 1])
  seen[g] = true
  if n ~= (by_group[g] or 0) then
    bad('gactive ' .. g .. ' is ' .. gactive[i + 1] .. ' but ' .. (by_group[g] or 0) .. ' are active')
  end
end
for g, n in pairs(by_group) do
  if not seen[g] then bad('gactive misses lane ' .. g .. ' with ' .. n .. ' active') end
end

-- Every row: a known state, an integer attempts, and a place (unless awaiting children).
local job_prefix = base .. 'job:'
scan_keys(job_prefix .. '*', function(key)
  local id = string.sub(key, #job_prefix + 1)
  if #id ~= 14 then return end
  if rcall('TYPE', key)['ok'] ~= 'hash' then
    bad(id .. ' has a row key that is not a hash')
    return
  end
  local row = rcall('HMGET', key, 'state', 'attempts', 'lease_epoch')
  if not STATES[row[1] or ''] then bad(id .. ' has unknown state ' .. tostring(row[1])) end
  if not row[2] or not string.match(row[2], '^%d+$') then
    bad(id .. ' has attempts ' .. tostring(row[2]) .. ', not an integer')
  end
  if row[1] == 'active' and row[3] ~= row[2] then
    bad(id .. ' is active but its lease_epoch ' .. tostring(row[3]) .. ' is not attempts ' .. tostring(row[2]))
  end
  if row[3] and row[1] ~= 'active' and row[1] ~= 'pending' then
    bad(id .. ' (state ' .. tostring(row[1]) .. ') holds an open lease_epoch')
  end
  if not where[id] and row[1] ~= 'awaiting_children' then
    bad(id .. ' (state ' .. tostring(row[1]) .. ') is in no set')
  end
end)
return out
