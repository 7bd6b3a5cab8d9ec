-- settle: the bodies of complete and retry, shared by complete.lua, retry.lua and the batch
-- settle.lua. Needs common and fence. Each returns its verdict, or the EMQSTALE text as a
-- string (the single-job scripts turn it into an error reply; the batch returns it in place).

-- complete: fence, leave active (or the waiting set after a reap), retire the row and its
-- logs. The caller bumps metrics:completed (once per batch). Returns 1 | 0 (gone) | text.
local function complete_one(base, id, jk, token)
  local row, err = fence(jk, token, 'complete')
  if err then return err end
  if not row then return 0 end
  -- No release(): the row is deleted just below, lease_epoch with it.
  if row[2] == 'active' then leave_active(base, id, row[3]) else leave_waiting(base, id, row[3]) end
  rcall('DEL', jk, jk .. ':logs')
  return 1
end

-- retry: fence, release, then dead at the attempt ceiling or scheduled at now + delay_ms.
-- Returns 'scheduled' | 'dead' | 0 (gone) | text.
local function retry_one(base, id, jk, token, delay_ms, max_attempts, error_text, now)
  local row, err = fence(jk, token, 'retry')
  if err then return err end
  if not row then return 0 end
  release(base, id, jk, row)
  if tonumber(row[1]) >= max_attempts then
    rcall('HSET', jk, 'state', 'dead', 'last_error', error_text)
    rcall('ZADD', base .. 'dead', 0, id)
    rcall('HINCRBY', base .. 'metrics:failed', 'count', 1)
    return 'dead'
  end
  rcall('HSET', jk, 'state', 'scheduled', 'last_error', error_text)
  rcall('ZADD', base .. 'schedule', now + delay_ms, id)
  return 'scheduled'
end
