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
