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
  -- A retired id continues its old count (common.lua, retire): no (id, token) pair is ever
  -- handed out twice. `floor` keeps the count it came back with, so max_attempts still
  -- gives the new incarnation its full budget.
  local attempts = rcall('HGET', base .. 'retired', id) or '0'
  local fields = {'state', state, 'attempts', attempts, 'payload', payload}
  if g then
    fields[#fields + 1] = 'group'
    fields[#fields + 1] = g
  end
  if attempts ~= '0' then
    fields[#fields + 1] = 'floor'
    fields[#fields + 1] = attempts
  end
  -- The row's HSET is the admission's first write, on purpose: it is a deny-oom command, so
  -- under noeviction at maxmemory Redis refuses it and the call writes nothing. Were any
  -- other write first (a cleanup), Redis would let every later write of the script through.
  rcall('HSET', jk, unpack(fields))
  if attempts ~= '0' then
    rcall('HDEL', base .. 'retired', id)
    rcall('ZREM', base .. 'retired:at', id)
  end
  if due then
    rcall('ZADD', waiting_key(base, g), 0, id)
    emit_in(base, 'enqueued', id, g)
    return 'enqueued'
  end
  rcall('ZADD', base .. 'schedule', run_at, id)
  emit_in(base, 'scheduled', id, g, 'run_at', run_at)
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
-- a new job. Expired markers are dropped by the next enqueue, after its admission (the
-- cleanup must not be the first write, see admit), and are ignored until then.
-- A job admitted as 'scheduled' leaves '<id>:<nonce>:s', so a resend answers what the first
-- copy answered ('replayed:scheduled'), even when its at_ms has passed since.
local function forget_expired(base, nonce, now)
  if nonce ~= '' then rcall('ZREMRANGEBYSCORE', base .. 'recent', '-inf', now) end
end

local function replayed(base, id, nonce, now)
  if nonce == '' then return false end
  local mark = base .. 'recent'
  local until_ms = rcall('ZSCORE', mark, id .. ':' .. nonce)
  if until_ms and tonumber(until_ms) > now then return 'replayed' end
  until_ms = rcall('ZSCORE', mark, id .. ':' .. nonce .. ':s')
  if until_ms and tonumber(until_ms) > now then return 'replayed:scheduled' end
  return false
end

-- The marker of one admitted job: its verdict is in the name (see replayed).
local function marker(id, nonce, verdict)
  if verdict == 'scheduled' then return id .. ':' .. nonce .. ':s' end
  return id .. ':' .. nonce
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
