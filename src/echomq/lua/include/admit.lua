-- admit: the enqueue core, shared by enqueue and enqueue_many. Needs common.
-- Order is normative: policy (kind) before existence (duplicate) before write.
-- run_at: nil = now; else the server-clock ms at which the job becomes due.
-- Returns the verdict: 'enqueued' | 'scheduled' | 'duplicate' | 'kind'.
local function admit(base, id, payload, g, run_at, now)
  if string.sub(id, 1, 3) ~= 'JOB' then return 'kind' end
  local jk = base .. 'job:' .. id
  if rcall('EXISTS', jk) == 1 then return 'duplicate' end
  local due = (run_at == nil) or (run_at <= now)
  local state = 'scheduled'
  if due then state = 'pending' end
  if g then
    rcall('HSET', jk, 'state', state, 'attempts', '0', 'payload', payload, 'group', g)
  else
    rcall('HSET', jk, 'state', state, 'attempts', '0', 'payload', payload)
  end
  if due then
    rcall('ZADD', waiting_key(base, g), 0, id)
    return 'enqueued'
  end
  rcall('ZADD', base .. 'schedule', run_at, id)
  return 'scheduled'
end

-- Resolve the run time of an enqueue: mode 'now' | 'in' (server clock + ms) | 'at' (the
-- caller's absolute ms, the only client-clock input, D10).
local function run_time(mode, value, now)
  if mode == 'in' then return now + tonumber(value) end
  if mode == 'at' then return tonumber(value) end
  return nil
end

-- Lost replies (no blind double admission): a client that may resend an enqueue whose reply
-- it lost sends every copy of one call with the same nonce. Each job the call admits leaves
-- the marker '<id>:<nonce>' in p..recent (a ZSET, score = the server ms until which a resend
-- may still come), and a resend that finds its marker answers 'replayed': the first copy
-- landed. That stays true after the job has completed and its row is gone, so a resend
-- never admits the job a second time; a new enqueue of a retired id (another nonce) is still
-- a new job. Expired markers are dropped by the next enqueue.
local function forget_expired(base, nonce, now)
  if nonce ~= '' then rcall('ZREMRANGEBYSCORE', base .. 'recent', '-inf', now) end
end

local function replayed(base, id, nonce)
  return nonce ~= '' and rcall('ZSCORE', base .. 'recent', id .. ':' .. nonce) ~= false
end

local function remember(base, marks, until_ms)
  for i = 1, #marks, 1000 do
    local args = {}
    for j = i, math.min(i + 999, #marks) do
      args[#args + 1] = until_ms
      args[#args + 1] = marks[j]
    end
    rcall('ZADD', base .. 'recent', unpack(args))
  end
end
