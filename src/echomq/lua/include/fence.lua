-- fence: the settling rule D5, shared by complete, retry, delay, extend and their batches.
-- Needs common. In order: the row exists (else gone), the token equals attempts (else
-- EMQSTALE), the lease generation is still open (else EMQSTALE ... lease settled): the job
-- is active, or pending because its lease lapsed and was reaped while nobody claimed it since.
--
-- lease_epoch is what tells a reaped job from one its holder already released: claim stamps
-- it with the new token, every release by the holder (complete, retry, delay) and a stall
-- death delete it, reap keeps it. So an old token can never settle a job after retry ->
-- promote, delay(0) or reprocess, and each lease generation settles at most once (D13).
-- Returns row {attempts, state, group, lease_epoch, floor}, or nil with an error text (nil,
-- nil = gone). floor: the attempts a re-admitted id came back with (admit.lua), or nil.
-- wide: the row also carries what a finishing settle reads (row[6] dedup, row[7..11] the
-- flow fields, see flow_of in compose.lua), so complete and retry read the row once.
local function fence(jk, token, verb, wide)
  -- redis.pcall, not the hmget helper (common.lua): this runs once per job of a worker's
  -- batch, so it skips a call and a vararg copy; the nil-for-a-non-hash rule is the same.
  local row
  if wide then
    -- The flow fields a settle needs only for a flow member (one with parent or children)
    -- are read below for such a row alone: a field a row lacks costs a scan of its listpack
    -- and a reply element, per job of the batch.
    row = redis.pcall('HMGET', jk, 'attempts', 'state', 'group', 'lease_epoch', 'floor', 'dedup',
      'parent', 'children')
  else
    row = redis.pcall('HMGET', jk, 'attempts', 'state', 'group', 'lease_epoch', 'floor')
  end
  if type(row) ~= 'table' or row.err or not row[1] then return nil, nil end
  -- A never-claimed job holds attempts "0": no caller can own it, so "0" is never a token.
  if row[1] ~= token or token == '0' then
    return nil, 'EMQSTALE ' .. verb .. ' token mismatch'
  end
  if row[4] ~= token or (row[2] ~= 'active' and row[2] ~= 'pending') then
    return nil, 'EMQSTALE ' .. verb .. ' lease settled'
  end
  if wide and (row[7] or row[8]) then
    -- A flow member (D18): the wide layout, row[7..11] = parent, parent_policy, children,
    -- parent_queue, flow (flow_of in compose.lua).
    local f = rcall('HMGET', jk, 'parent_policy', 'parent_queue', 'flow')
    return {row[1], row[2], row[3], row[4], row[5], row[6], row[7], f[1], row[8], f[2], f[3]}, nil
  end
  -- Not a flow member: row[7] (parent) and row[8] are unset, row[9..11] absent (nil).
  return row, nil
end

-- Release a fenced job from where it is: active, or (D5) pending/its lane when its lease
-- lapsed and was reaped but nobody claimed it since, so it is never in two places. The
-- lease generation closes here.
-- A cancel flag (D22) is a request to this lease's holder: it ends with the lease, so a job
-- that runs again (retried, delayed, pushed back) is not cancelled again by an old request.
local function release(base, id, jk, row)
  rcall('HDEL', jk, 'lease_epoch', 'cancel')
  if row[2] == 'active' then return leave_active(base, id, row[3]) end
  return leave_waiting(base, id, row[3])
end

-- Extend a fenced lease to `deadline` (server clock). A job whose lease lapsed and was reaped
-- back to pending, and that nobody claimed since, is re-armed into active (D5): its holder is
-- still alive, so the job leaves its waiting set and takes its lane slot again.
local function rearm(base, id, jk, row, deadline)
  if row[2] == 'pending' then
    if row[3] then rcall('HINCRBY', base .. 'gactive', row[3], 1) end
    leave_waiting(base, id, row[3])
    rcall('HSET', jk, 'state', 'active')
    emit_in(base, 'active', id, row[3], 'attempts', row[1], 'rearmed', '1')
  end
  rcall('ZADD', base .. 'active', deadline, id)
end
