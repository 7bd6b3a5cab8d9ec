-- compose: repeatable jobs (D19), and later flows (D18). Needs common, control and admit.
--
-- Registry: p..repeat ZSET (member = repeat name, score = its next fire, server ms; +inf
-- once spent or while paused), p..repeat:<name> HASH (payload, group, every_ms | cron + tz,
-- owner, slot; limit, until_ms, fired; paused, last_ms: issue 26), p..repeatfree
-- LIST (slots freed by repeat_remove) and meta.repeat_slots (slots minted so far).

--@lazy repeats
local EPOCH_MS = 1672531200000
local B62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'

-- A repeat's slot: a number in [0, 2^21) minted once per registration (a freed slot first,
-- else the meta counter `repeat_slots`) and kept in its row (`slot`), so no two repeats
-- registered on the queue at once hold the same slot: occurrence ids never collide, whatever
-- the names. A row written before slots existed (no `slot`) gets one here, on its next
-- repeat_set or fire, before any occurrence of it uses the new id. Returns the slot, or nil
-- when all 2^21 are held (checked before any write). Below 2^21: bit 21 of an occurrence id
-- stays clear, and every minted id has it set (D2), so no producer can take an occurrence's
-- id. The id still packs the slot in 22 bits: a slot minted before 0.6 keeps its ids.
local REPEAT_SLOTS = 4194304
local SLOT_LIMIT = 2097152
local function repeat_slot(base, name)
  local sk = base .. 'repeat:' .. name
  local s = rcall('HGET', sk, 'slot')
  if s then return tonumber(s) end
  s = rcall('LPOP', base .. 'repeatfree')
  if not s then
    local used = tonumber(rcall('HGET', base .. 'meta', 'repeat_slots') or '0')
    if used >= SLOT_LIMIT then return nil end
    s = rcall('HINCRBY', base .. 'meta', 'repeat_slots', 1) - 1
  end
  rcall('HSET', sk, 'slot', s)
  return tonumber(s)
end

-- The job id of one occurrence, the same for every caller: the branded id of the integer
-- (fire ms since the id epoch) << 22 | slot. It has the layout of a minted id (time in the
-- high bits, modulo 2^41 ms), so occurrences sort by fire time among the queue's other jobs.
-- The 63-bit integer does not fit a Lua double, so it is divided by 62 as two limbs:
-- hi (the ms, < 2^41) and lo (< 2^22).
local function occurrence_id(slot, fire_ms)
  -- Kept below 2^41 ms (the year 2092) so the integer stays below 2^63.
  local hi = (fire_ms - EPOCH_MS) % 2199023255552
  local lo = slot % REPEAT_SLOTS
  local digits = {}
  for i = 11, 1, -1 do
    local r = hi % 62
    hi = (hi - r) / 62
    local v = r * 4194304 + lo
    local d = v % 62
    lo = (v - d) / 62
    digits[i] = string.sub(B62, d + 1, d + 1)
  end
  return 'JOB' .. table.concat(digits)
end

-- Issue 24: a repeat with `limit` (fires at most) or `until_ms` (no fire due after it, on
-- the fire's own time) is spent once `fired` reaches the limit or its next fire passes the
-- end: its entry then stays registered with the score +inf (it never comes due again, and
-- repeats() shows it ended) until it is unregistered or registered again with other limits.
local function repeat_spent(spec, fire_ms)
  if spec.limit and tonumber(spec.fired or '0') >= tonumber(spec.limit) then return true end
  if spec.until_ms then return fire_ms > tonumber(spec.until_ms) end
  return false
end

-- The score an entry moves to after a fire: `nxt`, or +inf when the repeat is spent.
local function repeat_next(base, name, nxt)
  local f = hmget(base .. 'repeat:' .. name, 'limit', 'until_ms', 'fired')
  if f and repeat_spent({limit = f[1], until_ms = f[2], fired = f[3]}, nxt) then return '+inf' end
  return nxt
end

-- Enqueue the occurrence of repeat `name` due at fire_ms. Returns 1 when a job was admitted;
-- 0 when the entry's row is gone, the repeat is spent (issue 24), or the id already exists
-- (the same occurrence, admitted by an earlier fire: never twice).
local function fire_repeat(base, name, fire_ms, now)
  local sk = base .. 'repeat:' .. name
  local spec = hmget(sk, 'payload', 'group', 'limit', 'until_ms', 'fired')
  if not spec or not spec[1] then return 0 end
  if repeat_spent({limit = spec[3], until_ms = spec[4], fired = spec[5]}, fire_ms) then
    return 0
  end
  local g = spec[2]
  if g == '' then g = false end
  local slot = repeat_slot(base, name)
  if not slot then return 0 end
  local verdict = admit(base, occurrence_id(slot, fire_ms), spec[1], g, nil, now)
  if verdict ~= 'enqueued' then return 0 end
  if spec[3] or spec[4] then rcall('HINCRBY', sk, 'fired', 1) end
  -- Issue 26: the server ms of the last fire that admitted an occurrence (repeats() shows it).
  rcall('HSET', sk, 'last_ms', now)
  touch(base, g, 1)
  return 1
end

-- The next fire of an every_ms entry after `now`, on the entry's own grid (score + k*every):
-- a fleet that was down for many periods fires once, not once per missed period.
local function next_every(score, every, now)
  if score > now then return score end
  return score + every * (math.floor((now - score) / every) + 1)
end
--@end

-- Flows (D18, same queue): a parent waits as `awaiting_children` (in no set) with
-- job:<pid>:deps = children not yet settled. A child row carries `parent` and
-- `parent_policy` ('fp': its death kills the parent; 'id': ignored, recorded). A child's
-- completion records its result in job:<pid>:processed (one record per child) and
-- decrements deps; the parent becomes pending (its lane) when deps reaches 0.

-- The flow fields of a row, read before a settle deletes it: {parent, policy, children,
-- parent_queue, flow} (children: set on a flow's inner node; parent_queue: set when the
-- parent is on another queue; flow: the mark of the add_flow call that wrote the node, the
-- same on every node of one tree) or nil for a job outside any flow.
local function flow_parent(jk)
  local f = hmget(jk, 'parent', 'parent_policy', 'children', 'parent_queue', 'flow')
  if not f or (not f[1] and not f[3]) then return nil end
  return f
end

-- The same, from a row that fence read wide (include/fence.lua): no second read of the row.
local function flow_of(row)
  if not row[7] and not row[9] then return nil end
  return {row[7], row[8], row[9], row[10], row[11]}
end

-- A child whose parent is on another queue cannot touch the parent's keys (another cluster
-- slot): its settle appends an entry to its OWN queue's outbox, in the same script, and the
-- pump delivers it to the parent's queue (echomq/protocol/compose.py deliver). Entries:
--   done: parent_queue \0 parent \0 child_id \0 result (the rest, may hold NULs)
--   fail: '' \0 'fail' \0 parent_queue \0 parent \0 child_id \0 policy \0 error
-- (a queue name is never empty, so the two kinds never collide). parent is the parent's id,
-- then ':' and the child's flow mark when it has one (a ':' is in no id; an entry written
-- before marks existed carries none and is delivered as before).
--@lazy flows
local function flow_outbox(base, f, id, kind, value)
  local entry
  local parent = f[1]
  if f[5] then parent = parent .. ':' .. f[5] end
  if kind == 'done' then
    entry = f[4] .. '\0' .. parent .. '\0' .. id .. '\0' .. value
  else
    entry = '\0fail\0' .. f[4] .. '\0' .. parent .. '\0' .. id .. '\0' .. (f[2] or 'fp') .. '\0' .. value
  end
  rcall('RPUSH', base .. 'flow:outbox', entry)
end

local function cross_queue(f)
  return f[4] and f[4] ~= ''
end

-- Batches (issue 42) are flows with an open parent: the batch's *anchor* is a flow parent
-- row (its payload the on_complete callback, '' without one) with row field `batch` (`open`,
-- `closed`, then `success` or `complete` once released) whose deps holds one extra count
-- until batch_close. Members are its children with policy 'id', so a member's death counts
-- as settled and the anchor's release IS on_complete, once, in the settling script. The
-- two other callbacks are kept on the anchor (`on_success`, `on_death`), encoded by the
-- client as id NUL lane NUL priority NUL payload, and admitted here the one time they fire,
-- their row naming the batch (`batch_of`: current_job().batch in the callback).
local function batch_callback(base, bid, spec)
  local a = string.find(spec, '\0', 1, true)
  local b = a and string.find(spec, '\0', a + 1, true)
  local c = b and string.find(spec, '\0', b + 1, true)
  if not c then return end  -- malformed: fires nothing (batch_open checked it)
  local id, g = string.sub(spec, 1, a - 1), string.sub(spec, a + 1, b - 1)
  local pri = tonumber(string.sub(spec, b + 1, c - 1)) or 0
  local jk = base .. 'job:' .. id
  if rcall('EXISTS', jk) == 1 then return end
  if g == '' then g = false end
  local fields = {'state', 'pending', 'attempts', '0', 'payload', string.sub(spec, c + 1), 'batch_of', bid}
  if g then fields[#fields + 1] = 'group'; fields[#fields + 1] = g end
  if pri ~= 0 then fields[#fields + 1] = 'priority'; fields[#fields + 1] = pri end
  rcall('HSET', jk, unpack(fields))
  rcall('ZADD', waiting_key(base, g), pri, id)
  emit_in(base, 'enqueued', id, g)
  sync(base, g)
  wake(base, 1)
end

-- A batch's anchor is released (closed, every member settled): on_success fires when no
-- member's counted outcome is a death; on_death can no longer fire. A bare anchor (no
-- on_complete) ends here as a completion ends a row. Returns true when the anchor is gone.
local function batch_done(base, pid, pk)
  local b = hmget(pk, 'on_success', 'payload', 'attempts')
  local ok = rcall('HLEN', pk .. ':unsuccessful') == 0
  if ok and b[1] then batch_callback(base, pid, b[1]) end
  rcall('HDEL', pk, 'on_success', 'on_death')
  rcall('HSET', pk, 'batch', ok and 'success' or 'complete')
  if b[2] ~= '' then return false end
  rcall('DEL', pk .. ':deps', pk .. ':processed', pk .. ':failed', pk .. ':unsuccessful')
  rcall('DEL', pk, pk .. ':logs', pk .. ':errors')
  retire_one(base, pid, b[3])
  return true
end

-- A member's death was counted toward its batch (pk, the anchor): the first one, while the
-- batch runs, is recorded (`died`) and fires on_death.
local function batch_death(base, pid, pk, id)
  local b = hmget(pk, 'batch', 'state', 'on_death')
  if not b or not b[1] or b[2] ~= 'awaiting_children' then return end
  if rcall('HSETNX', pk, 'died', id) == 0 then return end
  if b[3] then
    batch_callback(base, pid, b[3])
    rcall('HDEL', pk, 'on_death')
  end
end

-- Make an awaiting parent runnable.
local function flow_release(base, pid)
  local pk = base .. 'job:' .. pid
  local p = hmget(pk, 'state', 'group', 'priority', 'batch')
  if not p or p[1] ~= 'awaiting_children' then return end
  if p[4] and batch_done(base, pid, pk) then return end
  rcall('HSET', pk, 'state', 'pending')
  rcall('ZADD', waiting_key(base, p[2]), p[3] or 0, pid)
  -- A full sync, not touch(): touch's fast path trusts that a non-empty flat set is in the
  -- ring, and a sweep releasing a parent mid-loop has parked flat jobs it syncs only at its
  -- end (issue 22's model, F12: the flat set fell out of the ring).
  sync(base, p[2] or false)
  wake(base, 1)
end

-- The hashes a parent records its settled children in. A child is in at most one of them:
-- it counts once toward its parent, by its latest outcome. A child that died ignored
-- ('unsuccessful'), was reprocessed and then completed moves to 'processed' without a second
-- decrement, so the parent is never released while a sibling still runs (one incarnation of
-- the child cannot be counted on top of an earlier one's outcome).
local FLOW_HASHES = {'processed', 'unsuccessful', 'failed'}

-- Whether pk is the row of this child's own parent: a flow parent (`children`) written by the
-- same add_flow call (the same `flow` mark). A parent that is gone (removed, completed), an
-- unrelated job admitted under its id since (no `children`: the model's F13), or a new flow's
-- parent under the re-used id (another mark) takes nothing from an old child. A child and a
-- parent written before marks existed both have none and match as before.
local function flow_parent_row(pk, mark)
  local p = redis.pcall('HMGET', pk, 'children', 'flow')
  return type(p) == 'table' and not p.err and p[1] ~= false and p[2] == (mark or false)
end

-- Where child `id` is recorded in parent row pk's hashes, or nil.
local function flow_recorded(pk, id)
  for _, h in ipairs(FLOW_HASHES) do
    if rcall('HEXISTS', pk .. ':' .. h, id) == 1 then return h end
  end
  return nil
end

-- One child settled toward its parent: recorded in `hash` (its previous record, if any, is
-- moved there) and, when it was not counted before, deps drops by one: release at 0.
-- 'failed' (a fail_parent death) never counted: it killed the parent instead. A parent row
-- that is gone (removed) takes nothing: no orphan counter or hash is ever created.
local function flow_settled(base, pid, hash, id, value, mark)
  local pk = base .. 'job:' .. pid
  if not flow_parent_row(pk, mark) then return end
  local before = flow_recorded(pk, id)
  if before == hash then
    -- The same outcome again (a pump's redelivery, or a second ignored death): no count.
    rcall('HSET', pk .. ':' .. hash, id, value)
    return
  end
  if before then rcall('HDEL', pk .. ':' .. before, id) end
  rcall('HSET', pk .. ':' .. hash, id, value)
  if hash == 'unsuccessful' then batch_death(base, pid, pk, id) end
  if before == 'processed' or before == 'unsuccessful' then return end
  if rcall('DECR', pk .. ':deps') <= 0 then flow_release(base, pid) end
end

-- A child that will never settle (removed, cancelled while waiting, drained): its parent
-- stops waiting for it. Nothing is recorded; deps drops by one unless the child was already
-- counted (or killed the parent).
local function flow_dropped(base, pid, id, mark)
  local pk = base .. 'job:' .. pid
  if not flow_parent_row(pk, mark) or flow_recorded(pk, id) then return end
  if rcall('DECR', pk .. ':deps') <= 0 then flow_release(base, pid) end
end

-- A child completed (f = flow_parent of its row, read before the row was deleted).
local function flow_child_done(base, id, f, result)
  if not f or not f[1] then return end
  if cross_queue(f) then
    flow_outbox(base, f, id, 'done', result or '')
  else
    flow_settled(base, f[1], 'processed', id, result or '', f[5])
  end
end

-- A child died (dead-lettered): 'id' records it as an ignored failure and counts it as
-- settled; 'fp' records it in job:<pid>:failed and kills the parent, whose own parent is
-- told the same way (up the tree, in this script: the whole tree is on this queue's slot).
local function flow_child_dead(base, id, f, error_text)
  local depth = 0
  while f and f[1] and depth < 16 do
    if cross_queue(f) then
      flow_outbox(base, f, id, 'fail', error_text or '')
      return
    end
    local pid, pk = f[1], base .. 'job:' .. f[1]
    if f[2] == 'id' then
      flow_settled(base, pid, 'unsuccessful', id, error_text or '', f[5])
      return
    end
    if not flow_parent_row(pk, f[5]) then return end
    if rcall('HSETNX', pk .. ':failed', id, error_text or '') == 0 then return end
    local p = hmget(pk, 'state', 'group', 'attempts')
    if not p or p[1] ~= 'awaiting_children' then return end
    error_text = 'child ' .. id .. ' failed'
    rcall('HSET', pk, 'state', 'dead', 'last_error', error_text)
    dead_letter(base, pid)
    -- Its waiters learn it now (include/control.lua keep_death).
    keep_death(base, pid, error_text, p[3], nil, nil)
    id, f, depth = pid, flow_parent(pk), depth + 1
  end
end

-- A child row (f = flow_parent of it) leaves without a settle: removed, or cancelled while
-- it waited. A child on another queue tells its parent through the outbox (policy 'rm').
local function flow_child_removed(base, id, f)
  if not f or not f[1] then return end
  if cross_queue(f) then
    flow_outbox(base, {f[1], 'rm', f[3], f[4], f[5]}, id, 'fail', '')
  else
    flow_dropped(base, f[1], id, f[5])
  end
end

-- Delete a row's flow keys (remove, and a parent's completion).
local function flow_forget(jk)
  rcall('DEL', jk .. ':deps', jk .. ':processed', jk .. ':failed', jk .. ':unsuccessful')
end
--@end

-- D22: a job whose lease lapsed while its holder had been asked to stop is not run again:
-- the sweep (reap.lua, the counted stall sweep) ends it as the holder would have, dead-
-- lettered "cancelled", or removed for cancel(remove=True). The job has already left active
-- (the sweep's ZREM, its lane slot freed). Needs control (dedup, kept outcomes).
--@lazy cancels
local function end_cancelled(base, id, jk, g, flag, attempts, now)
  local f = flow_parent(jk)
  release_dedup(base, id, jk)
  if flag == 'remove' then
    if f then flow_child_removed(base, id, f) end
    flow_forget(jk)
    rcall('DEL', jk, jk .. ':logs', jk .. ':errors')
    retire_one(base, id, attempts)
    emit_in(base, 'removed', id, g, 'state', 'active', 'cancelled', '1')
  else
    rcall('HSET', jk, 'state', 'dead', 'last_error', 'cancelled')
    rcall('HDEL', jk, 'lease_epoch', 'cancel')
    dead_letter(base, id, now)
    bump_metrics(base, 'failed', 1, now)
    emit_in(base, 'dead', id, g, 'error', 'cancelled')
    if f then flow_child_dead(base, id, f, 'cancelled') end
  end
  if rcall('EXISTS', base .. 'want:' .. id) == 1 then
    keep_outcome(base, id, 'error', 'cancelled', attempts, 60000, now)
  end
end
--@end
