-- settle: the bodies of complete and retry, shared by complete.lua, retry.lua and the batch
-- settle.lua. Needs common and fence. Each returns its verdict, or the EMQSTALE text as a
-- string (the single-job scripts turn it into an error reply; the batch returns it in place).

-- complete: fence, leave active (or the waiting set after a reap), retire the row and its
-- logs (recording the id's last token, common.lua retire). The caller bumps
-- metrics:completed (once per batch). Returns 1 | 0 (gone) | text.
-- result (optional): what a flow parent records for this child (D18, include/compose.lua).
-- now: the caller's clock read. keep: the queue's keep_completed setting (include/history.lua)
-- or false: a kept row stays, state `completed`, in p..completed (trimmed by the caller).
local function complete_one(base, id, jk, token, result, now, keep)
  local row, err = fence(jk, token, 'complete', true)
  if err then return err end
  if not row then return 0 end
  -- No release(): the row is deleted just below, lease_epoch with it (or closed when kept).
  if row[2] == 'active' then leave_active(base, id, row[3]) else leave_waiting(base, id, row[3]) end
  release_dedup_of(base, id, row[6])
  local flow = flow_of(row)  -- D18 (include/compose.lua)
  if flow then
    flow_child_done(base, id, flow, result)
    -- A kept parent keeps its children's outcomes; its trim deletes them (history.lua).
    if flow[3] and not keep then flow_forget(jk) end
  end
  if keep then
    keep_completed_row(base, id, jk, now)
  else
    if row[1] == '1' then rcall('DEL', jk, jk .. ':logs') else rcall('DEL', jk, jk .. ':logs', jk .. ':errors') end
    retire_one(base, id, row[1])
  end
  emit_in(base, 'completed', id, row[3], 'attempts', row[1])
  return 1
end

local ERRORS_KEPT = 10  -- per job: the errors of its last attempts, in <row>:errors

-- retry: fence, release, then dead at the attempt ceiling or scheduled at now + delay_ms.
-- Returns 'scheduled' | 'dead' | 'removed' (cancelled with remove, D22) | 0 (gone) | text.
-- keep_ms (optional, D17): a dead-letter keeps its error that long and wakes its waiters.
local function retry_one(base, id, jk, token, delay_ms, max_attempts, error_text, now, keep_ms)
  local row, err = fence(jk, token, 'retry', true)
  if err then return err end
  if not row then return 0 end
  -- D22: the flag is read before release() clears it (it belongs to this lease generation).
  local remove = error_text == 'cancelled' and rcall('HGET', jk, 'cancel') == 'remove'
  release(base, id, jk, row)
  -- D22, cancel(remove=True): the holder's "cancelled" settle removes the job instead of
  -- dead-lettering it (as remove.lua does); a kept outcome still tells its waiters why.
  if remove then
    release_dedup_of(base, id, row[6])
    local flow = flow_of(row)
    if flow then flow_child_removed(base, id, flow) end
    flow_forget(jk)
    rcall('DEL', jk, jk .. ':logs', jk .. ':errors')
    retire_one(base, id, row[1])
    emit_in(base, 'removed', id, row[3], 'state', 'active', 'cancelled', '1')
    if keep_ms and keep_ms > 0 then keep_outcome(base, id, 'error', error_text, row[1], keep_ms, now) end
    return 'removed'
  end
  -- The ceiling counts this incarnation's attempts: a re-admitted id came back with `floor`.
  local attempt = tonumber(row[1]) - tonumber(row[5] or '0')
  -- The errors of its attempts, the last ERRORS_KEPT (echomq job shows them; the key goes
  -- with the row).
  rcall('RPUSH', jk .. ':errors', 'attempt ' .. attempt .. ': ' .. error_text)
  rcall('LTRIM', jk .. ':errors', -ERRORS_KEPT, -1)
  if attempt >= max_attempts then
    rcall('HSET', jk, 'state', 'dead', 'last_error', error_text)
    dead_letter(base, id, now)
    bump_metrics(base, 'failed', 1, now)
    emit_in(base, 'dead', id, row[3], 'attempts', row[1], 'error', error_text)
    release_dedup_of(base, id, row[6])
    keep_death(base, id, error_text, row[1], keep_ms, now)
    local flow = flow_of(row)  -- D18 (include/compose.lua)
    if flow then flow_child_dead(base, id, flow, error_text) end
    return 'dead'
  end
  rcall('HSET', jk, 'state', 'scheduled', 'last_error', error_text)
  rcall('ZADD', base .. 'schedule', now + delay_ms, id)
  emit_in(base, 'retried', id, row[3], 'attempts', row[1], 'delay_ms', delay_ms)
  return 'scheduled'
end

-- complete many: the same fence and the same moves as complete_one, per job, with the flat
-- jobs' ZREM active, the row DELs and the metric batched into one command each.
-- Reads count (id, token) pairs from args at index i; returns the next index and verdicts.
-- results (optional): id -> the result a completion passed (what a flow parent records).
-- keep: the queue's keep_completed setting or false (as complete_one); kept rows are trimmed
-- here, once for the batch.
local function complete_many(base, args, i, count, results, now, keep)
  local verdicts, flat, rows, seen, ok, retired = {}, {}, {}, {}, 0, {}
  for _ = 1, count do
    local id = args[i]
    local jk = base .. 'job:' .. id
    local row, err = nil, nil
    -- The DELs come at the end: an id named twice is gone by its second mention once the
    -- first completed it; a refused mention changed nothing, so the next one is fenced anew.
    -- A kept row (keep) is written in place: its second mention is fenced on it (stale).
    if keep or not seen[id] then row, err = fence(jk, args[i + 1], 'complete', true) end
    if row then seen[id] = true end
    if err then
      verdicts[#verdicts + 1] = err
    elseif not row then
      verdicts[#verdicts + 1] = 0
    else
      if row[2] ~= 'active' then
        leave_waiting(base, id, row[3])
      elseif row[3] then
        leave_active(base, id, row[3])
      else
        flat[#flat + 1] = id
      end
      -- The per-job work of features most jobs do not use is behind a plain test: this loop
      -- runs once per job of the worker's batch.
      if row[6] then release_dedup_of(base, id, row[6]) end
      if row[7] or row[9] then
        local flow = flow_of(row)  -- D18 (include/compose.lua)
        flow_child_done(base, id, flow, (results and results[id]) or '')
        if flow[3] and not keep then
          -- A parent's row goes now with its flow keys, not with the batch's DELs: a child of
          -- it settled later in this batch must find it gone, as after a complete of its own
          -- (else it records into the forgotten keys: an orphan deps = -1, the model's F14).
          -- A kept parent keeps its row and its children's outcomes (D25): a later child
          -- moves its record there, as it would after the batch.
          flow_forget(jk)
          rcall('DEL', jk)
        end
      end
      if keep then
        keep_completed_row(base, id, jk, now)
      else
        rows[#rows + 1] = jk
        rows[#rows + 1] = jk .. ':logs'
        -- Only a retry writes <row>:errors, and a job that was retried has attempts > 1.
        if row[1] ~= '1' then rows[#rows + 1] = jk .. ':errors' end
        retired[#retired + 1] = id
        retired[#retired + 1] = row[1]
      end
      if events_bound ~= false then emit_in(base, 'completed', id, row[3], 'attempts', row[1]) end
      ok = ok + 1
      verdicts[#verdicts + 1] = 1
    end
    i = i + 2
  end
  -- Lua's unpack has a C-stack limit: a batch past 2000 goes in slices.
  if #flat > 2000 then
    for j = 1, #flat, 2000 do
      rcall('ZREM', base .. 'active', unpack(flat, j, math.min(j + 1999, #flat)))
    end
  elseif #flat > 0 then
    rcall('ZREM', base .. 'active', unpack(flat))
  end
  if #rows > 0 then
    if #rows > 2000 then
      for j = 1, #rows, 2000 do rcall('DEL', unpack(rows, j, math.min(j + 1999, #rows))) end
    else
      rcall('DEL', unpack(rows))
    end
  end
  if ok > 0 then
    bump_metrics(base, 'completed', ok, now)
    if keep then kept_trim(base, 'completed', keep, ok, now) else retire(base, retired) end
  end
  return i, verdicts
end
