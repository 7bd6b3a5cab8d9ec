-- admit: the enqueue core, shared by enqueue and enqueue_many. Needs common.
-- Order is normative: policy (kind) before existence (duplicate) before write.
-- run_at: nil = now; else the server-clock ms at which the job becomes due.
-- fresh: the client minted the id in this call, so no token was ever handed out for it and
-- the retired record is not read (a minted id is unique: time, node and sequence).
-- pri: the job's priority (0..2^21, lower runs first; nil or 0 = the default). A non-zero
-- one is the row field `priority` and the job's score in its waiting set, so claims (ZPOPMIN)
-- serve it by priority, then mint order; 0 writes no field, so a default job pays no byte.
-- expires (optional, issue 24): the server-clock ms past which a claim dead-letters the job
-- "expired" instead of leasing it (include/lease.lua); nil: no deadline, no field.
-- keep (optional): the job's log bound (the option keep_logs, 1..MAX_ARG), the row field
-- `keep_logs` that add_log trims to; nil: every line, no field.
-- due (optional): a batch caller's list of the due jobs' (score, id) pairs: a due job is
-- appended there instead of its own ZADD, and the caller adds them all with due_flush before
-- anything reads the waiting set (one ZADD per call instead of one per job).
-- Returns the verdict: 'enqueued' | 'scheduled' | 'duplicate' | 'kind'.
local function admit(base, id, payload, g, run_at, now, fresh, pri, expires, due_list, keep)
  if string.sub(id, 1, 3) ~= 'JOB' then return 'kind' end
  local jk = base .. 'job:' .. id
  if rcall('EXISTS', jk) == 1 then return 'duplicate' end
  local due = (run_at == nil) or (run_at <= now)
  local state = 'scheduled'
  if due then state = 'pending' end
  -- A retired id continues its old count (common.lua, retire): no (id, token) pair is ever
  -- handed out twice. `floor` keeps the count it came back with, so max_attempts still
  -- gives the new incarnation its full budget.
  local attempts, was = '0', false
  if not fresh then attempts, was = retired_last(base, id) end
  pri = pri or 0
  -- The common row (flat, first incarnation, default priority, no ttl): no table to build.
  local plain = not g and attempts == '0' and pri == 0 and not expires and not keep
  local fields = nil
  if not plain then
    fields = {'state', state, 'attempts', attempts, 'payload', payload}
    if g then
      fields[#fields + 1] = 'group'
      fields[#fields + 1] = g
    end
    if attempts ~= '0' then
      fields[#fields + 1] = 'floor'
      fields[#fields + 1] = attempts
    end
    if pri ~= 0 then
      fields[#fields + 1] = 'priority'
      fields[#fields + 1] = pri
    end
    if expires then
      fields[#fields + 1] = 'expires'
      fields[#fields + 1] = expires
    end
    if keep then
      fields[#fields + 1] = 'keep_logs'
      fields[#fields + 1] = keep
    end
  end
  -- The row's HSET is the admission's first write, on purpose: it is a deny-oom command, so
  -- under noeviction at maxmemory Redis refuses it and the call writes nothing. Were any
  -- other write first (a cleanup), Redis would let every later write of the script through.
  if plain then
    rcall('HSET', jk, 'state', state, 'attempts', attempts, 'payload', payload)
  else
    rcall('HSET', jk, unpack(fields))
  end
  if was then unretire(base, id) end
  -- A new incarnation of an id the caller named: an earlier one's kept outcome and wake token
  -- must not answer this one's waiters (docs/PROTOCOL.md, the side-key lifecycle). A minted
  -- id never had an earlier incarnation, so the common path pays nothing.
  if not fresh then rcall('DEL', base .. 'result:' .. id, base .. 'notify:' .. id) end
  if due then
    if due_list then
      -- The default score as text: a Lua number is formatted (printf "%.14g") per argument.
      if pri == 0 then due_list[#due_list + 1] = '0' else due_list[#due_list + 1] = pri end
      due_list[#due_list + 1] = id
    else
      rcall('ZADD', waiting_key(base, g), pri, id)
    end
    emit_in(base, 'enqueued', id, g)
    return 'enqueued'
  end
  rcall('ZADD', base .. 'schedule', run_at, id)
  emit_in(base, 'scheduled', id, g, 'run_at', run_at)
  return 'scheduled'
end

-- Add admit's batched due jobs to waiting set g (Lua's unpack has a C-stack limit: slices).
local function due_flush(base, g, due_list)
  local wk = waiting_key(base, g)
  for j = 1, #due_list, 2000 do
    rcall('ZADD', wk, unpack(due_list, j, math.min(j + 1999, #due_list)))
  end
end

-- Resolve the run time of an enqueue: mode 'now' | 'in' (server clock + ms) | 'at' (the
-- caller's absolute ms, the only client-clock input, D10).
local function run_time(mode, value, now)
  if mode == 'in' then return now + tonumber(value) end
  if mode == 'at' then return tonumber(value) end
  return nil
end

-- Lost replies (no blind double admission): a client that may resend an enqueue whose reply
-- it lost sends every copy of one call with the same nonce (12 hex digits), and flags the
-- copies after the first as resends. The first copy of a call leaves a marker of what it
-- admitted; only a resend looks for one, so the happy path pays one write and no read. A
-- resend that finds the marker answers what the first copy answered ('replayed' for
-- enqueued): the job is never admitted twice, even after it completed and its row is gone.
-- A resend that finds none is the call's first landing and is admitted as usual. A new
-- enqueue of a retired id (a new call, another nonce) is still a new job.
--
-- A single enqueue's marker is one field of a small HASH shared by the calls of one second
-- of the client's clock (the call names it, the same on every copy, so a resend reads one
-- field and the first copy reads no clock):
--           p..recent:<replay_ms>:<second>:<nonce[1..2]>
--           field nonce[3..12] .. the id's last 4 characters, value 'e' | 's' (scheduled)
-- The key expires as a whole, replay_ms + 2 s after the last write that set its TTL: a
-- client flags 'x' on its calls to a key until one of them has admitted (so set the TTL),
-- and every later marker it writes there comes within that second of its clock, so each
-- marker outlives its call's replay window, and no key is left without a TTL by a client
-- that wrote one. The common call is one HSET. A client spreads a second's calls over about
-- one key per 32 (nonce[1..2], its choice); with at most 256 keys a second, each stays small
-- enough for the server's compact (listpack) hash encoding up to ~30k enqueues/s
-- (docs/CAPACITY.md). A call that names no second gets the server's, and sets the TTL.
-- An enqueue_many call leaves one STRING p..recent:<nonce> with every job's verdict.
--
-- The id is the marker (issue 28): the common call -- an id minted by the client in this
-- call ('f'), due now, with 0 < replay_ms <= ID_REPLAY_MS (the default retry_for gives 70 s)
-- -- sends no nonce and leaves no marker at all. A minted id is unique (time, node,
-- sequence), so a resend of it that finds its row, or finds it in the retired record
-- (include/common.lua: every deleted row is recorded there, claimed or not, and the record
-- keeps every retirement of the last ID_REPLAY_MS), knows its first copy landed and
-- answers 'replayed' (its verdict was 'enqueued': due now). One that finds neither is the
-- call's first landing. The cost moved from every enqueue (one HSET) to nothing: the
-- deleting scripts write the retired record anyway, and only its retention grew.

-- The marker's key and field of a single enqueue (rm: replay_ms as the call sent it).
local function marker_of(base, id, nonce, rm, second)
  return base .. 'recent:' .. rm .. ':' .. second .. ':' .. string.sub(nonce, 1, 2),
    string.sub(nonce, 3) .. string.sub(id, -4)
end

-- The first copy of a single enqueue admitted `verdict` ('enqueued' | 'scheduled').
local function mark_one(key, field, verdict, replay_ms, ttl)
  local v = 'e'
  if verdict == 'scheduled' then v = 's' end
  rcall('HSET', key, field, v)
  -- A key this client already timed may have been deleted under it since (obliterate, an
  -- operator's DEL): one PTTL read keeps a re-created key from living for ever.
  if ttl or rcall('PTTL', key) == -1 then rcall('PEXPIRE', key, replay_ms + 2000) end
end

-- A resend of a single enqueue: what its first copy answered, or false when none landed.
--@lazy replays
local function find_one(key, field)
  local v = rcall('HGET', key, field)
  if v == 'e' then return 'replayed' end
  if v == 's' then return 'replayed:scheduled' end
  return false
end
--@end

-- enqueue_many: one code a job ('e' enqueued, 's' scheduled, 'd' duplicate, 'k' kind).
--@lazy batch_replays
local CODE = {enqueued = 'e', scheduled = 's', duplicate = 'd', kind = 'k'}
local REPLAY = {e = 'replayed', s = 'replayed:scheduled', d = 'duplicate', k = 'kind'}

local function mark_many(base, nonce, verdicts, replay_ms)
  local codes = {}
  for i, v in ipairs(verdicts) do codes[i] = CODE[v] or 'd' end
  rcall('SET', base .. 'recent:' .. nonce, table.concat(codes), 'PX', replay_ms + 1000)
end

-- A resend of an enqueue_many call: the first copy's verdicts, or nil when none landed.
local function find_many(base, nonce)
  local codes = rcall('GET', base .. 'recent:' .. nonce)
  if not codes then return nil end
  local out = {}
  for i = 1, #codes do out[i] = REPLAY[string.sub(codes, i, i)] end
  return out
end
--@end
