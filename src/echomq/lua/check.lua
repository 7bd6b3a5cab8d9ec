--[[ check: the read-only consistency checker (D6), in bounded slices. Each call checks one
  section and returns where to continue, so no call holds the server long however large the
  database (a full-keyspace SCAN in one script held a 1M-key server 1.1 s). _protocol.check
  drives the sections to the end and merges their lines.
  A live queue may change between calls, so every violation is decided inside one call from
  that call's own reads: per id (its row and every set it is in), per lane, per ring entry,
  and the aggregates (ring size, gactive, registry) in the one 'core' call. A transition
  between slices can hide a violation from this pass; it cannot invent one.
  KEYS[1] meta      HASH  emq:{q}:meta   (pins the queue's slot for the base and the SCANs)
  ARGV[1] base            emq:{q}:   (a glob-safe prefix)
  ARGV[2] section         core | members | lanes | ring | rows | results | dedups | ttls |
                          repeats | repeatidx
  ARGV[3] where           members: pending | active | schedule | dead | completed | lane:<g>; lanes,
                          rows, results, dedups, ttls, repeats: the SCAN cursor ('0' to start);
                          core, ring, repeatidx: ''
  ARGV[4] offset          members, ring, repeatidx: the window's start (0 to start)
  ARGV[5] count           > 0, the window / SCAN COUNT
  Returns {{violation, ...}, next, {lane, ...}}: next is the offset or cursor to continue
    from, -1 / '0' when the section is done; the lanes section lists the lanes it found
  Flags: reads replay
]]
--@include common
local base, section, where = ARGV[1], ARGV[2], ARGV[3]
local offset, count = tonumber(ARGV[4] or '0'), tonumber(ARGV[5] or '1000')
local out = {}
local function bad(s) out[#out + 1] = s end
local STATES = {pending = true, active = true, scheduled = true, dead = true,
  completed = true, awaiting_children = true}
-- completed: the kept completed rows (issue 24), scored by their finish time.
local SETS = {pending = 'pending', active = 'active', schedule = 'scheduled', dead = 'dead',
  completed = 'completed'}
local SET_ORDER = {'pending', 'active', 'schedule', 'dead', 'completed'}
local lane_prefix = base .. 'g:'

-- Every place an id is in, read now: the four sets and its row's lane (and `also`, a lane
-- it was found in).
local function places_of(id, group, also)
  local found = {}
  for _, p in ipairs(SET_ORDER) do
    if rcall('ZSCORE', base .. p, id) then found[#found + 1] = p end
  end
  local seen = {}
  for _, g in ipairs({group or false, also or false}) do
    if g and not seen[g] and rcall('ZSCORE', waiting_key(base, g), id) then
      found[#found + 1] = 'lane ' .. g
      seen[g] = true
    end
  end
  return found
end

local function two_places(id, found)
  for i = 1, #found - 1 do
    -- The names in a fixed order, so two slices reporting the same pair write one line.
    local a, b = found[i], found[i + 1]
    if b < a then a, b = b, a end
    bad(id .. ' is in two places: ' .. a .. ' and ' .. b)
  end
end

-- One member of a set: a live row, the state the set means, the lane the row names, the
-- score of a lexical set, and no other place.
local function member(place, id, score, lane)
  local jk = base .. 'job:' .. id
  if rcall('EXISTS', jk) == 0 then
    bad(id .. ' in ' .. place .. ' has no row (ghost)')
    return
  end
  local row = hmget(jk, 'state', 'group', 'priority')
  if not row then
    bad(id .. ' in ' .. place .. ' has a row that is not a hash')
    return
  end
  local expect = SETS[place] or 'pending'
  if row[1] ~= expect then
    bad(id .. ' in ' .. place .. ' has state ' .. tostring(row[1]) .. ', not ' .. expect)
  end
  if lane and row[2] ~= lane then
    bad(id .. ' in ' .. place .. ' has group ' .. tostring(row[2]))
  end
  if place == 'pending' and row[2] then
    bad(id .. ' in the flat pending set has group ' .. row[2])
  end
  -- A waiting set scores a job by its priority (the row field, absent = 0); dead by the
  -- time of death (server ms; 0 for a job dead-lettered before D25 scored it).
  if lane or place == 'pending' then
    local want = tonumber(row[3] or '0')
    if tonumber(score) ~= want then
      bad(id .. ' in ' .. place .. ' has score ' .. score .. ', not ' .. tostring(want))
    end
  elseif place == 'dead' and not (tonumber(score) >= 0 and tonumber(score) % 1 == 0) then
    bad(id .. ' in dead has score ' .. score .. ', not a time of death')
  end
  two_places(id, places_of(id, row[2], lane))
end

-- One row: a known state, an integer attempts, a lease_epoch only while its lease is open,
-- and a place (unless awaiting children).
-- A per-job side key (docs/PROTOCOL.md, the side-key lifecycle): a flow parent's counter
-- and hashes exist only beside their parent's row, and the counter is never negative.
local FLOW_KEYS = {deps = true, processed = true, failed = true, unsuccessful = true}
local function side_of(id, suffix, key)
  if not FLOW_KEYS[suffix] then return end
  if rcall('EXISTS', base .. 'job:' .. id) == 0 then
    bad(id .. ':' .. suffix .. ' is an orphaned flow key (its parent row is gone)')
    return
  end
  if suffix == 'deps' then
    local n = redis.pcall('GET', key)
    if type(n) ~= 'string' or not string.match(n, '^%-?%d+$') then
      bad(id .. ':deps is not an integer')
    elseif tonumber(n) < 0 then
      bad(id .. ':deps is negative (' .. n .. '): a child was counted twice')
    elseif tonumber(n) == 0 and redis.pcall('HGET', base .. 'job:' .. id, 'state') == 'awaiting_children' then
      bad(id .. ' awaits children but its counter is 0: its release was missed')
    else
      -- A batch's anchor (issue 42): held exactly while open or closed; its release decides
      -- (success | complete) and deletes the callbacks it did not fire.
      local b = redis.pcall('HMGET', base .. 'job:' .. id, 'batch', 'state', 'on_success', 'on_death')
      if type(b) == 'table' and b[1] then
        local held = b[2] == 'awaiting_children'
        if held ~= (b[1] == 'open' or b[1] == 'closed') then
          bad('batch ' .. id .. ' is ' .. b[1] .. ' but its anchor is ' .. tostring(b[2]))
        elseif not held and (b[3] or b[4]) then
          bad('batch ' .. id .. ' was released with a callback undecided')
        end
      end
    end
  end
end

local function row_of(key)
  local id = string.sub(key, #base + 5)
  if #id > 15 and string.sub(id, 15, 15) == ':' then
    return side_of(string.sub(id, 1, 14), string.sub(id, 16), key)
  end
  if #id ~= 14 then return end
  if rcall('TYPE', key)['ok'] ~= 'hash' then
    bad(id .. ' has a row key that is not a hash')
    return
  end
  local row = rcall('HMGET', key, 'state', 'attempts', 'lease_epoch', 'group', 'cancel')
  if row[5] and row[1] ~= 'active' then
    bad(id .. ' (state ' .. tostring(row[1]) .. ') holds a cancel flag: it outlived its run')
  end
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
  if row[1] ~= 'awaiting_children' and #places_of(id, row[4], nil) == 0 then
    bad(id .. ' (state ' .. tostring(row[1]) .. ') is in no set')
  end
end

-- One lane found by key (not only by the registry, which is itself under test).
local function lane_of(g)
  if rcall('ZCARD', waiting_key(base, g)) == 0 then return end
  if rcall('SISMEMBER', base .. 'lanes', g) == 0 then bad('lane ' .. g .. ' is missing from the registry') end
  if serviceable(base, g) and rcall('SISMEMBER', base .. 'inring', g) == 0 then
    bad('the ring misses serviceable lane ' .. g)
  end
end

-- One ring entry: live (inring) or stale (ringstale), not both; a live one is serviceable.
local function entry(g)
  local live = rcall('SISMEMBER', base .. 'inring', g) == 1
  local stale = rcall('SISMEMBER', base .. 'ringstale', g) == 1
  if live and stale then
    bad('the ring entry ' .. g .. ' is both live and stale')
  elseif live then
    if not serviceable(base, g) then bad('the ring holds ' .. g .. ', which is not serviceable') end
  elseif not stale then
    bad('the ring entry ' .. g .. ' is in neither inring nor ringstale')
  end
end

-- The aggregates, atomically: the ring's size against its two SETs (the whole ring is read
-- only when they disagree), the flat set's ring entry, the registry, gactive.
local function core()
  local ring = base .. 'ring'
  local live, stale = rcall('SMEMBERS', base .. 'inring'), rcall('SMEMBERS', base .. 'ringstale')
  if rcall('LLEN', ring) ~= #live + #stale then
    local listed = {}
    for _, g in ipairs(rcall('LRANGE', ring, 0, -1)) do
      if listed[g] then bad('the ring holds ' .. g .. ' twice') end
      listed[g] = true
    end
    for _, g in ipairs(live) do
      if not listed[g] then bad('inring holds ' .. g .. ', which the ring does not') end
    end
    for _, g in ipairs(stale) do
      if not listed[g] then bad('ringstale holds ' .. g .. ', which the ring does not') end
    end
    if serviceable(base, FLAT) and not (listed[FLAT] and rcall('SISMEMBER', base .. 'inring', FLAT) == 1) then
      bad('the ring misses the flat set')
    end
  elseif serviceable(base, FLAT) and rcall('SISMEMBER', base .. 'inring', FLAT) == 0 then
    bad('the ring misses the flat set')
  end
  for _, g in ipairs(rcall('SMEMBERS', base .. 'lanes')) do
    if rcall('ZCARD', waiting_key(base, g)) == 0 then
      bad('the registry lists lane ' .. g .. ', which holds no job')
    end
  end
  -- gactive == the lane jobs in active.
  local by_group = {}
  for _, id in ipairs(rcall('ZRANGE', base .. 'active', 0, -1)) do
    local row = hmget(base .. 'job:' .. id, 'group')
    if row and row[1] then by_group[row[1]] = (by_group[row[1]] or 0) + 1 end
  end
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
  -- The retired record: a generation grows past RETIRED_GEN only while its rotation is held
  -- back, and then carries a TTL (common.lua retire); twice that with none stays forever.
  for _, gen in ipairs({'retired', 'retired:old'}) do
    local n = rcall('HLEN', base .. gen)
    if n > 2 * RETIRED_GEN and rcall('PTTL', base .. gen) == -1 then
      bad('the retired record\'s ' .. gen .. ' holds ' .. n .. ' ids and no TTL: it never shrinks')
    end
  end
end

-- The keys that must carry a TTL (the ttls section), by the head of their suffix, and what
-- each is called in a violation; `limiter` alone is the queue's own rate-limit counter.
local TIMED = {'recent:', 'limiter:', 'result:', 'notify:', 'want:'}
local TIMED_WHAT = {['recent:'] = 'replay marker', ['limiter:'] = 'rate-limit counter',
  limiter = 'rate-limit counter', ['result:'] = 'kept result',
  ['notify:'] = 'result wake list', ['want:'] = 'waiter mark'}

local function timed_head(rest)
  if rest == 'limiter' then return rest end
  for _, head in ipairs(TIMED) do
    if string.sub(rest, 1, #head) == head then return head end
  end
  return nil
end

local function is_inf(score)
  return score and tonumber(score) == math.huge
end

-- One repeat's spec: listed in the index; a paused or spent one scored +inf (never due); no
-- more fires than its limit; its slot below the counter of slots minted and not free for
-- another repeat to take (a shared slot is a shared occurrence id: one of them never fires).
local function repeat_of(name, key)
  if rcall('TYPE', key)['ok'] ~= 'hash' then
    bad('repeat ' .. name .. ' has a spec that is not a hash')
    return
  end
  local f = rcall('HMGET', key, 'paused', 'limit', 'fired', 'slot')
  local score = rcall('ZSCORE', base .. 'repeat', name)
  if not score then
    bad('repeat ' .. name .. ' has a spec but no entry in the repeat index: it never fires')
  elseif f[1] == '1' and not is_inf(score) then
    bad('repeat ' .. name .. ' is paused but due at ' .. score .. ': it would fire')
  elseif f[2] and tonumber(f[3] or '0') >= tonumber(f[2]) and not is_inf(score) then
    bad('repeat ' .. name .. ' is spent (fired ' .. (f[3] or '0') .. ' of ' .. f[2]
      .. ') but due at ' .. score .. ': it would fire again')
  end
  if f[4] then
    local minted = tonumber(rcall('HGET', base .. 'meta', 'repeat_slots') or '0')
    if not tonumber(f[4]) or tonumber(f[4]) >= minted then
      bad('repeat ' .. name .. ' holds slot ' .. f[4] .. ', not below the ' .. minted
        .. ' slots minted: a new repeat may take it')
    elseif rcall('LPOS', base .. 'repeatfree', f[4]) then
      bad('repeat ' .. name .. ' holds slot ' .. f[4]
        .. ', which is also free: a new repeat may take it')
    end
  end
end

local nxt, found = -1, {}
if section == 'core' then
  core()
elseif section == 'members' then
  local lane = false
  local key = base .. where
  if string.sub(where, 1, 5) == 'lane:' then
    lane = string.sub(where, 6)
    key = waiting_key(base, lane)
  elseif not SETS[where] then
    return redis.error_reply('EMQARG check: unknown place ' .. where)
  end
  local place = where
  if lane then place = 'lane ' .. lane end
  local m = rcall('ZRANGE', key, offset, offset + count - 1, 'WITHSCORES')
  for i = 1, #m, 2 do member(place, m[i], m[i + 1], lane) end
  if #m / 2 == count then nxt = offset + count end
elseif section == 'ring' then
  local entries = rcall('LRANGE', base .. 'ring', offset, offset + count - 1)
  for _, g in ipairs(entries) do entry(g) end
  if #entries == count then nxt = offset + count end
elseif section == 'lanes' then
  local r = rcall('SCAN', where, 'MATCH', lane_prefix .. '*:pending', 'COUNT', count)
  nxt = r[1]
  for _, key in ipairs(r[2]) do
    local g = string.sub(key, #lane_prefix + 1, -9)
    found[#found + 1] = g
    lane_of(g)
  end
elseif section == 'results' then
  -- A kept outcome belongs to one incarnation: beside a live row (not dead, not a kept
  -- completed one) it is an older
  -- incarnation's, which a new admission or a reprocess must have deleted.
  local r = rcall('SCAN', where, 'MATCH', base .. 'result:*', 'COUNT', count)
  nxt = r[1]
  for _, key in ipairs(r[2]) do
    local id = string.sub(key, #base + 8)
    local state = redis.pcall('HGET', base .. 'job:' .. id, 'state')
    if type(state) == 'string' and state ~= 'dead' and state ~= 'completed' then
      bad(id .. ' has a kept result beside a live row (state ' .. state .. '): an older incarnation\'s')
    end
  end
elseif section == 'dedups' then
  -- A simple dedup key (no TTL) is released when its holder ends: one whose holder's row is
  -- gone was never released (an enqueue treats it as free, but it is a leak).
  local r = rcall('SCAN', where, 'MATCH', base .. 'de:*', 'COUNT', count)
  nxt = r[1]
  for _, key in ipairs(r[2]) do
    local holder = redis.pcall('GET', key)
    if type(holder) == 'string' and rcall('PTTL', key) == -1
      and rcall('EXISTS', base .. 'job:' .. holder) == 0 then
      bad('dedup key ' .. string.sub(key, #base + 4) .. ' is held by ' .. holder .. ', which is gone')
    end
  end
elseif section == 'ttls' then
  -- Keys that live by their TTL alone, no script deleting them (PROTOCOL §1.3): a replay
  -- marker, a rate-limit counter (its window never reopens without one), a kept result, its
  -- wake list, a waiter's registration. One without a TTL stays forever (issue 37).
  local r = rcall('SCAN', where, 'MATCH', ARGV[1] .. '*', 'COUNT', count)  -- all, as obliterate
  nxt = r[1]
  for _, key in ipairs(r[2]) do
    local rest = string.sub(key, #base + 1)
    local head = timed_head(rest)
    if head and rcall('PTTL', key) == -1 then
      bad('the ' .. TIMED_WHAT[head] .. ' ' .. rest .. ' has no TTL: it never expires')
    end
  end
elseif section == 'repeats' then
  -- Each repeat's spec against its entry in the index (`repeat`, scored by the next fire)
  -- and the slot counter its occurrence ids are built from (§5.4).
  local r = rcall('SCAN', where, 'MATCH', base .. 'repeat:*', 'COUNT', count)
  nxt = r[1]
  for _, key in ipairs(r[2]) do repeat_of(string.sub(key, #base + 8), key) end
elseif section == 'repeatidx' then
  local names = rcall('ZRANGE', base .. 'repeat', offset, offset + count - 1)
  for _, name in ipairs(names) do
    if rcall('EXISTS', base .. 'repeat:' .. name) == 0 then
      bad('the repeat index lists ' .. name .. ', which has no spec')
    end
  end
  if #names == count then nxt = offset + count end
elseif section == 'rows' then
  local r = rcall('SCAN', where, 'MATCH', base .. 'job:*', 'COUNT', count)
  nxt = r[1]
  for _, key in ipairs(r[2]) do row_of(key) end
else
  return redis.error_reply('EMQARG check: unknown section ' .. tostring(section))
end
return {out, nxt, found}
