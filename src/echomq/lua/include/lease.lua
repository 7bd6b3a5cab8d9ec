-- lease: the claim core (D4), shared by claim, claim_batch and settle. Needs common.

-- Lua's unpack has a C-stack limit: commands with many arguments go in chunks.
local function call_chunked(cmd, key, args, step)
  if #args <= step then return rcall(cmd, key, unpack(args)) end
  for i = 1, #args, step do
    rcall(cmd, key, unpack(args, i, math.min(i + step - 1, #args)))
  end
end

-- Only what a client can hold and settle is ever handed out: a token is a decimal integer
-- below 2^53 (at most 15 digits; tonumber would also take '1.5', 'nan', '-1', '0x10', and
-- hand out a fractional, zero or negative token that no settle can present), and a job id is
-- a branded id (D2: 3 uppercase letters and 11 base62 digits, at most 2^63-1).
local function integer_text(s)
  return s and #s <= 15 and string.match(s, '^[0-9]+$') ~= nil
end

-- The 11 base62 digits, compared byte by byte with the largest legal value: Lua's `<=` on
-- strings follows the server's collation locale (strcoll), under which 'Z' may sort after
-- 'z' and a valid id would read as too large. Digits < upper < lower in ASCII, as in base62.
local BRAND_MAX = 'AzL8n0Y58m7'
local function branded(id)
  if #id ~= 14 or string.match(id, '^[A-Z][A-Z][A-Z][0-9A-Za-z]+$') == nil then return false end
  -- The first digit decides unless it is BRAND_MAX's own 'A': one comparison for most ids.
  local first = string.byte(id, 4)
  if first ~= 65 then return first < 65 end
  for i = 2, 11 do
    local a, b = string.byte(id, i + 3), string.byte(BRAND_MAX, i)
    if a ~= b then return a < b end
  end
  return true
end

-- ---- issue 24, expiry (ttl_ms) ---------------------------------------------------------
-- A job enqueued with ttl_ms carries `expires` (server ms) until its first claim. A claim
-- that pops it later than that dead-letters it "expired" instead of leasing it, as a death
-- by any other cause: metrics, event, its simple dedup key released, its flow parent told,
-- a waiter woken. It was never leased: attempts and the lane's gactive stay as they were.
-- Needs control and compose (the including script inlines them first); cold in every script.
local function expire_job(base, id, jk, lane, attempts, now)
  rcall('HSET', jk, 'state', 'dead', 'last_error', 'expired')
  dead_letter(base, id, now)  -- counted for claim_n's trim_dead (keep_dead, include/history.lua)
  bump_metrics(base, 'failed', 1, now)
  emit_in(base, 'dead', id, lane, 'error', 'expired')
  release_dedup(base, id, jk)
  local flow = flow_parent(jk)
  if flow then flow_child_dead(base, id, flow, 'expired') end
  keep_death(base, id, 'expired', attempts, nil, now)
end
-- ---- end issue 24, expiry ---------------------------------------------------------------

-- Lease up to k of the oldest jobs of waiting set g (a lane or FLAT) at `deadline` (server
-- clock), appending {id, payload, attempts, group|false[, floor]} to out. Claim mints the token: the
-- row's attempts + 1, stamped as lease_epoch too, the open lease generation. A ghost (an id
-- whose row is gone) is discarded and the pop continues. A row that cannot be leased — a
-- hash without an integer attempts, or under an id that is not a branded id — is
-- dead-lettered with the reason; a key that is not a hash at all is dropped from the set and
-- logged. Neither is ever run.
-- A job past its `expires` (issue 24) is dead-lettered instead and the pop goes on.
-- Returns how many were leased.
-- Kept history (include/history.lua): while the queue keeps completed rows, a claim stamps
-- the row's claimed_ms (server ms), so a kept row shows its run time (finished - claimed).
-- Set by claim_n from the setting claim_gate read; nil: nothing stamped.
local claim_stamp = nil

local function lease_many(base, g, deadline, k, out, now)
  local wk = waiting_key(base, g)
  local lane = false
  if g ~= FLAT then lane = g end
  local got, scored = 0, {}
  -- Numbers passed to a command are formatted (printf "%.14g") per argument: the lease
  -- deadline once per call, each token once (as an integer), not per use.
  local dl = string.format('%d', deadline)
  while got < k do
    -- ZPOPMIN's order (score, then member), without its scores: a ZPOPMIN reply formats
    -- every score as a double and the script parses it back, for nothing.
    local popped = rcall('ZRANGE', wk, 0, k - got - 1)
    if #popped == 0 then break end
    rcall('ZREMRANGEBYRANK', wk, 0, #popped - 1)
    for i = 1, #popped do
      local id = popped[i]
      local jk = base .. 'job:' .. id
      local row = redis.pcall('HMGET', jk, 'payload', 'attempts', 'floor', 'expires')
      local hash = type(row) == 'table' and not row.err
      local att = hash and integer_text(row[2]) and branded(id) and tonumber(row[2])
      if att and row[4] and now > (tonumber(row[4]) or now) then
        expire_job(base, id, jk, lane, row[2], now)
      elseif att then
        -- The ttl bounds the wait before the first claim only (issue 24): it ends here.
        if row[4] then rcall('HDEL', jk, 'expires') end
        att = att + 1
        local tok = string.format('%d', att)
        if claim_stamp then
          rcall('HSET', jk, 'attempts', tok, 'state', 'active', 'lease_epoch', tok, 'claimed_ms', claim_stamp)
        else
          rcall('HSET', jk, 'attempts', tok, 'state', 'active', 'lease_epoch', tok)
        end
        scored[#scored + 1] = dl
        scored[#scored + 1] = id
        -- A re-admitted (or pushed-back) job also reports its floor, so the worker counts
        -- this incarnation's attempt (token - floor) as the retry ceiling does.
        if row[3] then
          out[#out + 1] = {id, row[1] or '', att, lane, row[3]}
        else
          out[#out + 1] = {id, row[1] or '', att, lane}
        end
        if events_bound ~= false then emit_in(base, 'active', id, lane, 'attempts', att) end
        got = got + 1
      elseif hash and rcall('EXISTS', jk) == 1 then
        local why = 'malformed row: attempts is not an integer'
        if not branded(id) then why = 'malformed row: the id is not a branded job id' end
        rcall('HSET', jk, 'state', 'dead', 'last_error', why)
        rcall('HDEL', jk, 'lease_epoch')
        dead_letter(base, id, now)
        bump_metrics(base, 'failed', 1)
        emit(base, 'dead', id, 'error', why)
      elseif rcall('EXISTS', jk) == 1 then
        redis.log(redis.LOG_WARNING, 'echomq: dropped ' .. id .. ' from ' .. wk .. ': not a hash')
      end
    end
  end
  if got > 0 then
    call_chunked('ZADD', base .. 'active', scored, 2000)
    if lane then rcall('HINCRBY', base .. 'gactive', lane, got) end
  end
  return got
end

-- How many jobs the ring head g may take in this turn: the rest of its weighted turn (the
-- head lane is served gweight times in a row, then rotated; the turn lives in meta
-- rr_lane/rr_n, so single and batch claims follow one schedule) and its limit headroom.
-- Returns k, and the lane's weight and served count for charge (nil when alone).
local function turn_room(base, g, want, alone)
  local k, w, served = want, nil, nil
  if not alone then
    w = tonumber(rcall('HGET', base .. 'gweight', g) or '1')
    local turn = rcall('HMGET', base .. 'meta', 'rr_lane', 'rr_n')
    served = 0
    if turn[1] == g then served = tonumber(turn[2]) end
    k = math.min(k, math.max(w - served, 1))
  end
  if g ~= FLAT then
    local lim = rcall('HGET', base .. 'glimit', g)
    if lim then
      local room = tonumber(lim) - tonumber(rcall('HGET', base .. 'gactive', g) or '0')
      k = math.min(k, room)
    end
    local max = lane_rate(base, g)  -- D21: no more than the lane's window still allows
    if max then k = math.min(k, rate_left(base .. 'limiter:' .. g, max)) end
  end
  return k, w, served
end

-- Count `n` serves against the head g's turn; rotate it to the back when the turn is spent.
-- live: g is still in the ring after this claim's sync (then it is still its head, nothing
-- else moved it); alone, w, served: what turn_room read before the lease (the lease moves no
-- lane in or out of the ring).
local function charge(base, g, n, live, alone, w, served)
  local ring = base .. 'ring'
  local meta = base .. 'meta'
  if not live then
    -- g left the ring (emptied, paused, at its limit): its turn is over.
    rcall('HDEL', meta, 'rr_lane', 'rr_n')
    return
  end
  if alone then return end
  served = served + n
  if served >= w then
    rcall('LMOVE', ring, ring, 'LEFT', 'RIGHT')
    rcall('HDEL', meta, 'rr_lane', 'rr_n')
  else
    rcall('HSET', meta, 'rr_lane', g, 'rr_n', served)
  end
end

-- Claim up to n jobs, serving the ring head (the flat set is the ring entry FLAT) for the rest
-- of its turn, then the next head. A head that is not serviceable, or turns out empty after
-- its ghosts, leaves the ring and the claim moves on, so a call never answers short while
-- work is claimable. Appends to out; returns how many were claimed.
-- The live head of the ring, dropping the stale entries before it (common.lua ring_add). An
-- entry in neither SET (planted, or a ring written before the SETs existed) is adopted when
-- its lane is serviceable, at the back, and dropped otherwise.
local function ring_head(base)
  local ring = base .. 'ring'
  while true do
    local g = rcall('LINDEX', ring, 0)
    if not g then return nil end
    if rcall('SISMEMBER', base .. 'inring', g) == 1 then return g end
    rcall('LPOP', ring)
    if rcall('SREM', base .. 'ringstale', g) == 0 and serviceable(base, g) then
      ring_add(base, g)
    end
  end
end

-- D21: lanes whose rate window has reopened (ratewait score <= now) come back to the ring.
local function readmit_rated(base, now)
  if not any_lane_rated(base) then return end  -- a lane leaves ratewait when its limit goes
  local due = rcall('ZRANGEBYSCORE', base .. 'ratewait', '-inf', now, 'LIMIT', 0, 100)
  for _, g in ipairs(due) do
    rcall('ZREM', base .. 'ratewait', g)
    touch(base, g, 0)  -- still spent (a clock edge): sync lists it again with its new time
  end
end

-- D21: what a claim that got nothing answers besides: the ms until the queue-wide window
-- reopens when it is spent, else until the first rate-held lane is readmitted; 0 when no
-- rate limit holds anything back (then the queue is empty or paused, or its lanes are full).
local function rate_wait(base, now)
  local qmax = queue_rate(base)
  if qmax and rate_left(base .. 'limiter', qmax) <= 0 then
    return math.max(rcall('PTTL', base .. 'limiter'), 1)
  end
  if any_lane_rated(base) then
    local first = rcall('ZRANGE', base .. 'ratewait', 0, 0, 'WITHSCORES')
    if #first > 0 then return math.max(tonumber(first[2]) - now, 1) end
  end
  return 0
end

local function claim_n(base, deadline, n, out, now)
  local ring = base .. 'ring'
  local got = 0
  now = now or now_ms()
  if kept_specs.keep_completed then claim_stamp = now end
  readmit_rated(base, now)
  -- D21: the queue-wide window caps every claim, lanes included.
  local qmax, qwindow = queue_rate(base)
  if qmax then n = math.min(n, math.max(rate_left(base .. 'limiter', qmax), 0)) end
  -- The queue-wide concurrency limit (limit.lua): no more than the room left in active.
  n = limit_room(base, n)
  while got < n do
    local g = ring_head(base)
    if not g then break end
    local alone = rcall('SCARD', base .. 'inring') == 1
    local leased, w, served = 0, nil, nil
    -- The ring holds exactly the serviceable sets, so a live FLAT head has jobs (were it empty,
    -- the lease finds none and the sync below drops it): only a lane is checked again.
    if g == FLAT or serviceable(base, g) then
      local k
      k, w, served = turn_room(base, g, n - got, alone)
      if k > 0 then leased = lease_many(base, g, deadline, k, out, now) end
      if leased > 0 and g ~= FLAT then
        local max, window = lane_rate(base, g)
        if max then rate_charge(base .. 'limiter:' .. g, leased, window) end
      end
    end
    local live = sync(base, g ~= FLAT and g, true)
    if leased > 0 then
      charge(base, g, leased, live, alone, w, served)
      got = got + leased
    elseif live then
      -- Defensive: a head that gave nothing must not be asked again in this call.
      rcall('LMOVE', ring, ring, 'LEFT', 'RIGHT')
    end
  end
  if qmax and got > 0 then rate_charge(base .. 'limiter', got, qwindow) end
  trim_dead(base, now)  -- keep_dead: a malformed row was dead-lettered (include/history.lua)
  return got
end
