-- control: what a caller steers a job with: kept results (D17), dedup keys (D20) and the
-- cancel flag (D22). Needs common. See echomq/protocol/control.py for the keys' layout.

-- D17: keep a finished job's outcome for keep_ms (field 'result' for a completion, 'error'
-- for a dead-letter) and wake its waiters. Nothing is written when keep_ms is 0.
-- The common case (nobody waits) costs the result hash alone: the wake token goes on the
-- per-job notify list only while a waiter's marker `want:<id>` exists. A waiter sets that
-- marker before it reads the result and blocks only after the read, so a completion either
-- sees the marker and pushes, or landed before the read (which then finds the result).
-- A waiter that takes the token puts it back (notify_rearm.lua), so every waiter, in every
-- process, is woken by this one push and none of them polls.
-- now (optional): the caller's clock read, so a batch reads TIME once.
--@lazy outcomes
local function keep_outcome(base, id, field, value, attempts, keep_ms, now)
  if not keep_ms or keep_ms <= 0 then return end
  local rk = base .. 'result:' .. id
  -- DEL: a reprocessed job's earlier outcome must not leave its other field behind.
  rcall('DEL', rk)
  rcall('HSET', rk, field, value, 'attempts', attempts or '0', 'finished_ms', now or now_ms())
  rcall('PEXPIRE', rk, keep_ms)
  if rcall('EXISTS', base .. 'want:' .. id) == 1 then
    local nk = base .. 'notify:' .. id
    rcall('RPUSH', nk, '1')
    rcall('PEXPIRE', nk, keep_ms)
  end
end
--@end

-- D17: a job died. Its error is kept keep_ms when the caller asked for it; else, when a
-- waiter is already waiting, for 60 s (as cancel and a stall death do), so the waiter raises
-- JobFailed at once instead of waiting out its timeout. Nobody waiting: nothing written.
local function keep_death(base, id, error_text, attempts, keep_ms, now)
  if keep_ms and keep_ms > 0 then
    keep_outcome(base, id, 'error', error_text, attempts, keep_ms, now)
  elseif rcall('EXISTS', base .. 'want:' .. id) == 1 then
    keep_outcome(base, id, 'error', error_text, attempts, 60000, now)
  end
end

-- D20: a finishing job (completed, dead, removed, cancelled) releases the dedup key it holds.
-- Only a simple key (no TTL) is released, and only while it still names this job: throttle
-- and debounce keys live out their TTL. Call it before the row is deleted (reads `dedup`).
-- release_dedup_of: the same, when the caller already read the row's `dedup` (did, or nil).
local function release_dedup_of(base, id, did)
  if type(did) ~= 'string' then return end
  local dk = base .. 'de:' .. did
  if rcall('GET', dk) == id and rcall('PTTL', dk) == -1 then rcall('DEL', dk) end
end

local function release_dedup(base, id, jk)
  -- pcall: a planted non-hash row must not fail the settle that carries it.
  release_dedup_of(base, id, redis.pcall('HGET', jk, 'dedup'))
end

-- D20: the holder of dedup id `did`, or false when the key is free. A debounce key whose
-- holder still waits (pending or scheduled) has the holder take this enqueue's payload, run
-- time (run_at nil: now), priority (pri, 0 = the default), expiry (expires nil: none) and
-- log bound (keep: keep_logs, nil: none) in place: the refused enqueue is folded into the held job, and the folded job is the newest
-- call's in every setting, so it is neither dead-lettered `expired` on the holder's older
-- deadline nor served at the holder's priority (issue 37). A lane cannot be folded (the
-- holder would have to move between waiting sets mid-debounce): a call for another lane
-- than the waiting holder's returns nil, the holder, its lane ('' none): the caller refuses
-- it (EMQSTATE), nothing written.
--@lazy dedup_holds
local function dedup_holder(base, did, mode, payload, run_at, now, g, pri, expires, keep)
  local holder = rcall('GET', base .. 'de:' .. did)
  if not holder then return false end
  local jk = base .. 'job:' .. holder
  if rcall('EXISTS', jk) == 0 and rcall('PTTL', base .. 'de:' .. did) == -1 then
    -- A simple key whose holder's row is gone without a settle (obliterated, lost) would be
    -- held forever: it is free. take_dedup overwrites it.
    return false
  end
  if mode ~= 'debounce' then return holder end
  local row = hmget(jk, 'state', 'group', 'lease_epoch', 'priority', 'expires', 'keep_logs')
  if not row or (row[1] ~= 'pending' and row[1] ~= 'scheduled') then return holder end
  if (row[2] or '') ~= (g or '') then return nil, holder, row[2] or '' end
  rcall('HSET', jk, 'payload', payload)
  -- A pending holder with an open lease generation was reaped while its lapsed holder may
  -- still run the old payload (D5 lets that holder settle it): that lease ends here, so the
  -- holder cannot complete the job and lose the payload folded into it.
  if row[3] then rcall('HDEL', jk, 'lease_epoch', 'cancel') end
  if tonumber(row[4] or '0') ~= pri then
    -- The row field first: a scheduled holder's promotion reads it (common.lua park).
    if pri == 0 then rcall('HDEL', jk, 'priority') else rcall('HSET', jk, 'priority', pri) end
    rcall('ZADD', waiting_key(base, row[2]), 'XX', pri, holder)
  end
  if expires then
    rcall('HSET', jk, 'expires', expires)
  elseif row[5] then
    rcall('HDEL', jk, 'expires')
  end
  if keep then
    rcall('HSET', jk, 'keep_logs', keep)
  elseif row[6] then
    rcall('HDEL', jk, 'keep_logs')
  end
  local due = run_at == nil or run_at <= now
  if row[1] == 'scheduled' then
    -- promote moves it to its waiting set (now when due), keeping the lane bookkeeping.
    rcall('ZADD', base .. 'schedule', run_at or now, holder)
  elseif not due and rcall('ZSCORE', waiting_key(base, row[2]), holder) then
    leave_waiting(base, holder, row[2])
    rcall('HSET', jk, 'state', 'scheduled')
    rcall('ZADD', base .. 'schedule', run_at, holder)
  end
  return holder
end
--@end

-- D20: the admitted job takes the dedup key (simple: no TTL, released by the settles).
--@lazy dedups
local function take_dedup(base, id, did, ttl_ms)
  local dk = base .. 'de:' .. did
  if ttl_ms > 0 then rcall('SET', dk, id, 'PX', ttl_ms) else rcall('SET', dk, id) end
  rcall('HSET', base .. 'job:' .. id, 'dedup', did)
end
--@end

-- Issue 37: whether a job moved since a caller (the dashboard's page) saw it. `seen` is
-- nil or '' (no check), a state, or 'state:attempts'; row is {state, group, attempts, ...}.
-- A state alone cannot tell a dead job from the same job reprocessed and dead again: the
-- attempts can.
local function moved_since(row, seen)
  if not seen or seen == '' then return false end
  local state, attempts = string.match(seen, '^([%a_]+):?(%d*)$')
  if not state then return true end
  if row[1] ~= state then return true end
  return attempts ~= '' and tostring(row[3] or '0') ~= attempts
end

-- D22: whether the holder of an active job was asked to stop (row field `cancel`).
local function cancel_flagged(jk)
  return rcall('HEXISTS', jk, 'cancel') == 1
end
