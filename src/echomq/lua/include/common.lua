-- common: helpers every transition shares. Inlined by protocol/scripts.py where a script says
-- "--@include common"; never loaded on its own.
local rcall = redis.call
-- The flat pending set's token in the ring. '*' is not a legal lane name (D3), so the token
-- can never collide with a lane.
local FLAT = '*'

-- The server clock in ms (D10): leases, in-delays, promote and reap never use a client clock.
local function now_ms()
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- HMGET that answers nil for a key that is not a hash (planted or corrupted), so one bad key
-- never fails a script, nor the whole worker batch that script call carries.
local function hmget(key, ...)
  local row = redis.pcall('HMGET', key, ...)
  if type(row) ~= 'table' or row.err then return nil end
  return row
end

-- Push n wake tokens (at most 64 kept) for consumers parked on BLPOP emq:{q}:wake. The
-- length is read first: a list already holding 64 has no parked consumer to wake (a parked
-- BLPOP would have taken a token), so a busy queue's enqueue writes no token and no trim.
local function wake(base, n)
  if n <= 0 then return end
  local room = 64 - rcall('LLEN', base .. 'wake')
  if room <= 0 then return end
  if n > room then n = room end
  local tokens = {}
  for i = 1, n do tokens[i] = '1' end
  rcall('LPUSH', base .. 'wake', unpack(tokens))
end

-- The waiting set of a lane, or the flat pending set when g is false/nil/FLAT.
local function waiting_key(base, g)
  if g and g ~= FLAT then return base .. 'g:' .. g .. ':pending' end
  return base .. 'pending'
end

--@include ratelimit
-- D15/D16: emit (events) and bump_metrics, for every transition below and in the scripts.
--@include observe

-- Kept history (include/history.lua): per script call, a meta setting's name ->
-- {count|nil, age_ms|nil}, or false when off. Parsed from "<count>:<age_ms>".
local kept_specs = {}

local function kept_parse(v)
  if not v then return false end
  local c, a = string.match(v, '^(%d*):(%d*)$')
  if not c then return false end
  return {tonumber(c), tonumber(a)}
end

-- One read of the queue's meta for a claim: the pause flag, the queue-wide rate limit
-- (cached for queue_rate), whether lanes have rate limits (cached for any_lane_rated), the
-- events bound (cached for emit), the queue-wide concurrency limit (cached for
-- queue_limit) and the kept-history setting of completions (cached for settle's
-- completions). True when paused.
local function claim_gate(base)
  local m = rcall('HMGET', base .. 'meta', 'paused', 'rate_max', 'rate_window_ms', 'events',
    'grated', 'limit', 'keep_completed')
  events_bound = m[4] or false
  seed_queue_rate(m[2], m[3])
  qlimit = tonumber(m[6]) or false
  lanes_rated = m[5] ~= false
  kept_specs.keep_completed = kept_parse(m[7])
  return m[1] ~= false
end

-- A lane is serviceable when it is non-empty, not paused, below its concurrency limit and
-- not held out by its rate limit (ratelimit.lua); the flat set when it is non-empty. The
-- ring holds exactly the serviceable ones.
local function serviceable(base, g)
  if rcall('ZCARD', waiting_key(base, g)) == 0 then return false end
  if g == FLAT then return true end
  if rcall('SISMEMBER', base .. 'paused', g) == 1 then return false end
  local lim = rcall('HGET', base .. 'glimit', g)
  if lim and tonumber(rcall('HGET', base .. 'gactive', g) or '0') >= tonumber(lim) then
    return false
  end
  if any_lane_rated(base) and rate_blocked(base, g) then return false end
  return true
end

-- The ring is a LIST (its order is the service order) with two SETs beside it: p..inring,
-- the lanes in the ring, and p..ringstale, lanes that left it while their LIST entry stays.
-- Each LIST entry is in exactly one of the two SETs. Joining and leaving are O(1) whatever the
-- ring's length (LPOS and LREM walk the LIST): a lane that leaves is only marked stale, and
-- its entry is dropped when it reaches the head (ring_head); a stale lane that comes back is
-- live again in its old place. Only these functions change the ring (check.lua verifies it).
local function ring_add(base, key)
  if rcall('SMOVE', base .. 'ringstale', base .. 'inring', key) == 1 then return end
  rcall('RPUSH', base .. 'ring', key)
  rcall('SADD', base .. 'inring', key)
end

local function ring_remove(base, key)
  local ring = base .. 'ring'
  rcall('SREM', base .. 'inring', key)
  if rcall('SCARD', base .. 'inring') == 0 then
    -- Nothing live is left: every entry is stale, the ring is empty.
    rcall('DEL', ring, base .. 'ringstale')
  elseif rcall('LINDEX', ring, 0) == key then
    rcall('LPOP', ring)
  elseif rcall('LINDEX', ring, -1) == key then
    rcall('RPOP', ring)
  else
    rcall('SADD', base .. 'ringstale', key)
  end
end

-- Retired ids (no ABA on the token): a caller-chosen id may be enqueued again after its row
-- was deleted. Its token is its attempts, so a re-admitted id restarting at 0 would hand out
-- (id, 1) a second time and a stale holder of the first incarnation could settle the new one.
-- Every script that deletes a row records the id's last attempts ('0' for a row never
-- claimed), and admit continues from there (retired_last). The record is two generations of
-- one HASH (id -> attempts): p..retired takes every retirement; once it holds RETIRED_GEN ids
-- it becomes p..retired:old, dropping the generation before -- but only once that one was
-- closed ID_REPLAY_MS ago or more (meta `retired_closed`, the server ms of the last
-- rotation); until then the current generation grows on, with a TTL (below). So the last
-- RETIRED_GEN retirements (up to twice that) when they come slower than RETIRED_GEN per
-- ID_REPLAY_MS, and every retirement of the last ID_REPLAY_MS, are remembered, for one
-- HSET per settle call and an HLEN on about one small call in eight (docs/RELIABILITY.md).
-- An id older than both restarts at 0.
--
-- The record is also what makes a resent enqueue of a minted id land once (include/admit.lua,
-- "the id is the marker"): a minted id is unique, so a resend that finds it retired knows its
-- first copy landed, even after that job completed or was removed.
local RETIRED_GEN = 25000
local ID_REPLAY_MS = 70000

-- pairs: {id, attempts, id, attempts, ...} of deleted rows. The caller has already written
-- (a ZREM/DEL): under noeviction these writes are never the script's first, so retiring a
-- job is never refused for memory (it frees more than it keeps).
local function retire(base, pairs_)
  if #pairs_ == 0 then return end
  local rk = base .. 'retired'
  if #pairs_ <= 1000 then
    rcall('HSET', rk, unpack(pairs_))  -- a worker's batch: one command, no slicing
  else
    for i = 1, #pairs_, 1000 do
      rcall('HSET', rk, unpack(pairs_, i, math.min(i + 999, #pairs_)))
    end
  end
  -- The size is looked at on a big batch, or when the sum of the first id's bytes is a
  -- multiple of 8 (about one small call in eight): a generation may pass RETIRED_GEN by what
  -- a few small calls retire, no more. The sum, not the last byte alone: ids a caller names
  -- may all end alike (every `encode('JOB', n)` of an n = 10 mod 62 ends in 'A'), and
  -- single deletions of such ids never looked, so the generation never rotated and grew
  -- without bound (issue 37).
  if #pairs_ < 64 then
    local id, sum = pairs_[1], 0
    if #id == 0 then error({err = 'ERR empty id'}) end  -- as native/common.c refuses it
    for i = 1, #id do sum = sum + string.byte(id, i) end
    if sum % 8 ~= 0 then return end
  end
  if rcall('HLEN', rk) >= RETIRED_GEN then
    local now = now_ms()
    local closed = tonumber(rcall('HGET', base .. 'meta', 'retired_closed') or '')
    if closed and closed <= now and now - closed < ID_REPLAY_MS then
      -- Held back: this generation grows past RETIRED_GEN (a burst) and would stay that
      -- large through any quiet spell after it, no deletion coming to rotate it. It is
      -- needed only for ID_REPLAY_MS after its last retirement (the replay rule; the token
      -- rule's window is RETIRED_GEN retirements, which a burst passes), so it takes a TTL,
      -- pushed on by every look during the hold and kept by the RENAME that makes it
      -- retired:old: the server drops it after the burst (issue 37). Looks come on every
      -- batch of 64 and about one small call in eight, and the hold ends ID_REPLAY_MS after
      -- the last rotation, so a retirement in it outlives its ID_REPLAY_MS unless no look
      -- followed it for ID_REPLAY_MS while the hold lasted.
      rcall('PEXPIRE', rk, 2 * ID_REPLAY_MS)
      return
    end
    -- UNLINK: the dropped generation is freed off the main thread (it may hold 25k fields).
    rcall('UNLINK', base .. 'retired:old')
    rcall('RENAME', rk, base .. 'retired:old')
    rcall('HSET', base .. 'meta', 'retired_closed', now)
  end
end

-- Record one deleted row's id with its last attempts ('0': never claimed). (A planted
-- non-integer attempts is not carried over: only what claim could mint.)
local function retire_one(base, id, attempts)
  if type(attempts) == 'string' and string.match(attempts, '^[0-9]+$') then
    retire(base, {id, attempts})
  end
end

-- The last token a retired id left ('0' when it is in neither generation, or was deleted
-- unclaimed), and whether it is recorded at all. An admission that finds it calls unretire
-- after its own first write: the new incarnation's row is the id's record now.
local function retired_last(base, id)
  local v = rcall('HGET', base .. 'retired', id) or rcall('HGET', base .. 'retired:old', id)
  return v or '0', v ~= false
end

local function unretire(base, id)
  rcall('HDEL', base .. 'retired', id)
  rcall('HDEL', base .. 'retired:old', id)
end

-- Make the ring and the lane registry (D14) agree with the truth for one lane (or the flat
-- set, g false). Recomputing from the sets, instead of patching per script, is what keeps
-- "ring == serviceable lanes" exact across every transition. Returns inring, inserted.
-- known_inring: the caller just read that the lane is live in the ring (the claim's head).
local function sync(base, g, known_inring)
  local key = g or FLAT
  if key ~= FLAT then
    if rcall('ZCARD', waiting_key(base, key)) > 0 then
      rcall('SADD', base .. 'lanes', key)
    else
      rcall('SREM', base .. 'lanes', key)
    end
  end
  local ring = base .. 'ring'
  -- Membership is read from the SET beside the LIST (O(1)), not LPOS on the LIST (O(ring
  -- length)): with 100k lanes every lane transition would otherwise scan the ring.
  local inring = known_inring or rcall('SISMEMBER', base .. 'inring', key) == 1
  if not inring and rcall('SCARD', base .. 'inring') == 0 and rcall('LLEN', ring) > 0 then
    -- A ring with entries but no live SET was written before the SETs existed (or damaged):
    -- adopt its entries once, so no lane gets a second entry.
    for _, g in ipairs(rcall('LRANGE', ring, 0, -1)) do rcall('SADD', base .. 'inring', g) end
    rcall('DEL', base .. 'ringstale')
    inring = rcall('SISMEMBER', base .. 'inring', key) == 1
  end
  if serviceable(base, key) then
    if not inring then
      ring_add(base, key)
      return true, true
    end
    return true, false
  end
  if inring then ring_remove(base, key) end
  if key ~= FLAT and rcall('ZCARD', waiting_key(base, key)) > 0 then
    -- D21: a lane whose window is spent waits in ratewait for the claim that readmits it.
    local max = lane_rate(base, key)
    local lk = base .. 'limiter:' .. key
    if max and rate_left(lk, max) <= 0 and not rcall('ZSCORE', base .. 'ratewait', key) then
      rcall('ZADD', base .. 'ratewait', now_ms() + math.max(rcall('PTTL', lk), 1), key)
    end
  end
  return false, false
end

-- Sync lane g after `added` jobs joined it and wake that many consumers; a lane that just
-- entered the ring wakes one consumer per waiting job (a resume or a freed slot).
local function touch(base, g, added)
  if not g and added > 0 and rcall('ZCARD', base .. 'pending') > added then
    -- The flat set was non-empty before these jobs, so FLAT is in the ring already (every
    -- script that empties or fills it syncs): skip the ring scan on the enqueue hot path.
    wake(base, added)
    return
  end
  local inring, inserted = sync(base, g)
  if inserted then
    wake(base, rcall('ZCARD', waiting_key(base, g)))
  elseif inring then
    wake(base, added)
  end
end

-- A tally of jobs added per waiting set (lane or FLAT) that remembers the order the sets
-- were first met. touch_all walks that order, not pairs(): pairs() follows the server's Lua
-- table internals (its string hash differs between Redis and Valkey), and the ring order a
-- sweep leaves must be one the native module can give too.
local function tally()
  return {order = {}, n = {}}
end

local function tally_add(t, key, by)
  local n = t.n[key]
  if n == nil then
    t.order[#t.order + 1] = key
    n = 0
  end
  t.n[key] = n + by
end

-- Touch every waiting set of the tally, in the order they were first met.
local function touch_all(base, added)
  for _, key in ipairs(added.order) do
    local n = added.n[key]
    if key == FLAT then touch(base, false, n) else touch(base, key, n) end
  end
end

-- Put a live job into its waiting set (its lane when grouped), state pending. No sync.
-- Its score is its priority (the row field, absent = 0): a job keeps its priority through
-- every way back to waiting (promote, reap, stall, delay, push-back, reprocess, run_now).
local function park(base, id, jk, g)
  rcall('ZADD', waiting_key(base, g), rcall('HGET', jk, 'priority') or 0, id)
  rcall('HSET', jk, 'state', 'pending')
end

-- A grouped job left active: its lane gets the slot back (the field goes at zero).
local function free_slot(base, g)
  if rcall('HINCRBY', base .. 'gactive', g, -1) <= 0 then rcall('HDEL', base .. 'gactive', g) end
end

-- Take a job out of active; a grouped job gives its lane slot back. Returns 1 if it was there.
local function leave_active(base, id, g)
  local n = rcall('ZREM', base .. 'active', id)
  if n == 1 and g then
    free_slot(base, g)
    touch(base, g, 0)
  end
  return n
end

-- Take a job out of its waiting set (flat or lane) and keep the ring exact.
local function leave_waiting(base, id, g)
  local n = rcall('ZREM', waiting_key(base, g), id)
  sync(base, g)
  return n
end

-- Kept history: keep_completed and its trim (issue 24).
--@include history
