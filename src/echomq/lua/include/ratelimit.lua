-- ratelimit: D21, max jobs per window_ms counted inside the claim (claim_n in lease.lua), on
-- the server clock. Inlined by common.lua (serviceable needs it); see echomq/protocol/control.py.
--   queue-wide: meta fields rate_max / rate_window_ms, counter p..limiter (STRING, PX window)
--   per lane:   p..grate HASH lane -> '<max>:<window_ms>', counter p..limiter:<lane>
--   p..ratewait ZSET lane -> the server ms its window reopens: a lane that spent its window
--   is out of the ring (not serviceable) while it is listed here; the next claim at or after
--   that time takes it out and syncs it back in (readmit_rated in lease.lua).

-- Whether any lane of the queue has a rate limit (meta field `grated`, kept by rate_limit.lua
-- while p..grate is not empty): read once per script call (claim_gate in common.lua reads it
-- with the pause flag), so a queue without lane limits pays nothing per lane looked at.
local lanes_rated = nil

local function any_lane_rated(base)
  if lanes_rated == nil then lanes_rated = rcall('HEXISTS', base .. 'meta', 'grated') == 1 end
  return lanes_rated
end

-- The lane's {max, window_ms}, or nil when the lane has no limit.
local function lane_rate(base, g)
  if not any_lane_rated(base) then return nil end
  local spec = rcall('HGET', base .. 'grate', g)
  if not spec then return nil end
  local max, window = string.match(spec, '^(%d+):(%d+)$')
  if not max then return nil end
  return tonumber(max), tonumber(window)
end

-- The queue-wide {max, window_ms}, or nil. Read once per script call (claim_gate in
-- common.lua reads it with the pause flag).
local qrate = nil  -- nil: not read yet; false: none; else {max, window_ms}

local function seed_queue_rate(max, window)
  if max then qrate = {tonumber(max), tonumber(window)} else qrate = false end
end

local function queue_rate(base)
  if qrate == nil then
    local spec = rcall('HMGET', base .. 'meta', 'rate_max', 'rate_window_ms')
    seed_queue_rate(spec[1], spec[2])
  end
  if not qrate then return nil end
  return qrate[1], qrate[2]
end

-- The queue-wide concurrency limit (meta `limit`, limit.lua): at most that many jobs of the
-- queue in active at once, lanes included. Read once per script call, with the pause flag.
local qlimit = nil  -- nil: not read yet; false: none; else the limit

-- How many more jobs the queue may lease now (n capped by the limit's room), never below 0.
local function limit_room(base, n)
  if qlimit == nil then qlimit = tonumber(rcall('HGET', base .. 'meta', 'limit')) or false end
  if not qlimit then return n end
  return math.max(math.min(n, qlimit - rcall('ZCARD', base .. 'active')), 0)
end

-- How many claims a limiter key still allows (max - count), and its PTTL.
--@lazy rates
local function rate_left(key, max)
  local used = tonumber(rcall('GET', key) or '0') or 0
  return max - used
end

-- Whether lane g is held out by its rate limit: listed in ratewait, or its window is spent.
local function rate_blocked(base, g)
  if not any_lane_rated(base) then return false end
  if rcall('ZSCORE', base .. 'ratewait', g) then return true end
  local max = lane_rate(base, g)
  return max ~= nil and rate_left(base .. 'limiter:' .. g, max) <= 0
end

-- Count n claims against a limiter key (the window starts at its first claim).
local function rate_charge(key, n, window)
  if rcall('INCRBY', key, n) == n then rcall('PEXPIRE', key, window) end
end
--@end
