-- ratelimit: D21, max jobs per window_ms counted inside the claim (claim_n in lease.lua), on
-- the server clock. Inlined by common.lua (serviceable needs it); see echomq/_control.py.
--   queue-wide: meta fields rate_max / rate_window_ms, counter p..limiter (STRING, PX window)
--   per lane:   p..grate HASH lane -> '<max>:<window_ms>', counter p..limiter:<lane>
--   p..ratewait ZSET lane -> the server ms its window reopens: a lane that spent its window
--   is out of the ring (not serviceable) while it is listed here; the next claim at or after
--   that time takes it out and syncs it back in (readmit_rated in lease.lua).

-- The lane's {max, window_ms}, or nil when the lane has no limit.
local function lane_rate(base, g)
  local spec = rcall('HGET', base .. 'grate', g)
  if not spec then return nil end
  local max, window = string.match(spec, '^(%d+):(%d+)$')
  if not max then return nil end
  return tonumber(max), tonumber(window)
end

-- The queue-wide {max, window_ms}, or nil.
local function queue_rate(base)
  local spec = rcall('HMGET', base .. 'meta', 'rate_max', 'rate_window_ms')
  if not spec[1] then return nil end
  return tonumber(spec[1]), tonumber(spec[2])
end

-- How many claims a limiter key still allows (max - count), and its PTTL.
local function rate_left(key, max)
  local used = tonumber(rcall('GET', key) or '0') or 0
  return max - used
end

-- Whether lane g is held out by its rate limit: listed in ratewait, or its window is spent.
local function rate_blocked(base, g)
  if rcall('ZSCORE', base .. 'ratewait', g) then return true end
  local max = lane_rate(base, g)
  return max ~= nil and rate_left(base .. 'limiter:' .. g, max) <= 0
end

-- Count n claims against a limiter key (the window starts at its first claim).
local function rate_charge(key, n, window)
  if rcall('INCRBY', key, n) == n then rcall('PEXPIRE', key, window) end
end
