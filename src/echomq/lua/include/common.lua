-- common: helpers every transition shares. Inlined by _scripts.py where a script says
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

-- Push n wake tokens (at most 64 kept) for consumers parked on BLPOP emq:{q}:wake.
local function wake(base, n)
  if n <= 0 then return end
  if n > 64 then n = 64 end
  local tokens = {}
  for i = 1, n do tokens[i] = '1' end
  if rcall('LPUSH', base .. 'wake', unpack(tokens)) > 64 then
    rcall('LTRIM', base .. 'wake', 0, 63)
  end
end

-- The waiting set of a lane, or the flat pending set when g is false/nil/FLAT.
local function waiting_key(base, g)
  if g and g ~= FLAT then return base .. 'g:' .. g .. ':pending' end
  return base .. 'pending'
end

-- A lane is serviceable when it is non-empty, not paused, and below its concurrency limit;
-- the flat set when it is non-empty. The ring holds exactly the serviceable ones.
local function serviceable(base, g)
  if rcall('ZCARD', waiting_key(base, g)) == 0 then return false end
  if g == FLAT then return true end
  if rcall('SISMEMBER', base .. 'paused', g) == 1 then return false end
  local lim = rcall('HGET', base .. 'glimit', g)
  if lim and tonumber(rcall('HGET', base .. 'gactive', g) or '0') >= tonumber(lim) then
    return false
  end
  return true
end

-- Make the ring and the lane registry (D14) agree with the truth for one lane (or the flat
-- set, g false). Recomputing from the sets, instead of patching per script, is what keeps
-- "ring == serviceable lanes" exact across every transition. Returns inring, inserted.
local function sync(base, g)
  local key = g or FLAT
  if key ~= FLAT then
    if rcall('ZCARD', waiting_key(base, key)) > 0 then
      rcall('SADD', base .. 'lanes', key)
    else
      rcall('SREM', base .. 'lanes', key)
    end
  end
  local ring = base .. 'ring'
  local inring = rcall('LPOS', ring, key)
  if serviceable(base, key) then
    if not inring then
      rcall('RPUSH', ring, key)
      return true, true
    end
    return true, false
  end
  if inring then rcall('LREM', ring, 0, key) end
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

-- Touch every waiting set a sweep added jobs to ({[lane or FLAT] = count}).
local function touch_all(base, added)
  for key, n in pairs(added) do
    if key == FLAT then touch(base, false, n) else touch(base, key, n) end
  end
end

-- Put a live job into its waiting set (its lane when grouped), state pending. No sync.
local function park(base, id, jk, g)
  rcall('ZADD', waiting_key(base, g), 0, id)
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
