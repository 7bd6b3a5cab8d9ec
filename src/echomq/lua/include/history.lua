-- history: kept history (issue 24). Needs common (and observe, which common includes).
--
-- A queue may keep its completed rows (meta `keep_completed`) and bound its dead set (meta
-- `keep_dead`). Each setting is one meta field "<count>:<age_ms>", either part empty for no
-- bound of that kind; an absent field is the default (completion deletes the row; the dead
-- set is unbounded). Kept completed rows sit in the ZSET p..completed scored by their finish
-- time (server ms); the dead set is scored by the time of death (server ms, D25), so
-- keep_dead bounds it by count and by age alike, the longest dead first (ties by id).
--
-- The script that adds to a set trims it, in the same call: at most `added + TRIM_SLACK`
-- rows per call (a lowered bound catches up over the next calls, never in one long call).
-- Trimming deletes each row with every side key the lifecycle table (docs/PROTOCOL.md §2.4)
-- ties to it -- logs, errors, a flow parent's counter and hashes -- and records its last
-- token as retired, as every deletion of a claimed row does. A kept result and its wake
-- token keep their own TTL. Trimming emits no event (history housekeeping, not a move).
local TRIM_SLACK = 100

-- The setting `name` ('keep_completed' | 'keep_dead') of the queue, read once per call.
local function kept_spec(base, name)
  local s = kept_specs[name]
  if s == nil then
    s = kept_parse(rcall('HGET', base .. 'meta', name))
    kept_specs[name] = s
  end
  return s
end

-- Delete trimmed rows and what the lifecycle table ties to them; retire their tokens.
-- Only a retry writes <row>:errors (a completed row with attempts '1' has none; a dead one
-- may: its one attempt failed) and only a flow parent (`children`) has flow keys: the DEL
-- names the keys a row can have, not all seven.
local function kept_drop(base, ids, dead)
  local keys, retired = {}, {}
  for _, id in ipairs(ids) do
    local jk = base .. 'job:' .. id
    local row = hmget(jk, 'attempts', 'children') or {}
    local att = row[1]
    if type(att) == 'string' and string.match(att, '^[0-9]+$') then
      retired[#retired + 1] = id
      retired[#retired + 1] = att
    end
    keys[#keys + 1] = jk
    keys[#keys + 1] = jk .. ':logs'
    if dead or att ~= '1' then keys[#keys + 1] = jk .. ':errors' end
    if row[2] then
      keys[#keys + 1] = jk .. ':deps'
      keys[#keys + 1] = jk .. ':processed'
      keys[#keys + 1] = jk .. ':failed'
      keys[#keys + 1] = jk .. ':unsuccessful'
    end
  end
  for j = 1, #keys, 2000 do rcall('DEL', unpack(keys, j, math.min(j + 1999, #keys))) end
  retire(base, retired)
end

-- Trim set `name` ('completed' | 'dead') to its setting after `added` rows joined it.
local function kept_trim(base, name, spec, added, now)
  local key = base .. name
  local n = 0
  if spec[1] then n = rcall('ZCARD', key) - spec[1] end
  if spec[2] then
    local aged = rcall('ZCOUNT', key, '-inf', '(' .. (now - spec[2]))
    if aged > n then n = aged end
  end
  if n <= 0 then return end
  if n > added + TRIM_SLACK then n = added + TRIM_SLACK end
  local ids = rcall('ZRANGE', key, 0, n - 1)
  rcall('ZREMRANGEBYRANK', key, 0, n - 1)
  kept_drop(base, ids, name == 'dead')
end

-- A completion that keeps its row: state `completed`, its finish time, the lease closed; the
-- row joins p..completed. Logs, errors and a parent's flow hashes stay with it.
local function keep_completed_row(base, id, jk, now)
  rcall('HSET', jk, 'state', 'completed', 'finished_ms', now)
  rcall('HDEL', jk, 'lease_epoch', 'cancel')
  rcall('ZADD', base .. 'completed', now, id)
end

-- Dead-lettering: every script that dead-letters a job adds it here, and calls trim_dead
-- before it returns, so the dead set is bounded in the same call (keep_dead).
local dead_added = 0
local dead_now = nil  -- the server clock, read once for a call's dead-letters without a `now`

-- Dead-letter id: scored by `now`, the calling script's server time (or read here, once).
local function dead_letter(base, id, now)
  if not now then
    dead_now = dead_now or now_ms()
    now = dead_now
  end
  rcall('ZADD', base .. 'dead', now, id)
  dead_added = dead_added + 1
end

-- Trim the dead set after this call's dead-letters, when the queue bounds it. Idempotent
-- within a call (the count restarts), so a script may call it on every way out.
local function trim_dead(base, now)
  if dead_added == 0 then return end
  local added = dead_added
  dead_added = 0
  local spec = kept_spec(base, 'keep_dead')
  if spec then kept_trim(base, 'dead', spec, added, now or now_ms()) end
end
