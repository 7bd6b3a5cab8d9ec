--[[ sweep_stalled: the counted stall sweep. Every lapsed lease bumps the row's `stalled`;
  below max_stalled the job goes back to pending (or its lane), at it the job is dead with
  last_error "stalled". A job whose holder was asked to stop (D22 cancel flag) is not
  counted: it is dead-lettered "cancelled" (or removed, cancel(remove=True)) and listed dead.
  KEYS[1] active    ZSET  emq:{q}:active
  KEYS[2] dead      ZSET  emq:{q}:dead
  ARGV[1] base            emq:{q}:
  ARGV[2] max_stalled     > 0
  ARGV[3] limit           > 0, jobs per call
  Returns {{recovered id, ...}, {dead id, ...}}
  Flags: writes replay
  Native: EMQ.SWEEP args=3
]]
--@include common
--@include args
--@include control
--@include compose
shape(2, 3, 3, 'ERR EMQ.SWEEP takes 2 keys (active, dead) and 3 args (sweep_stalled)')
local max_stalled, sweep_limit = int_arg(ARGV[2]), int_arg(ARGV[3])
local base = ARGV[1]
local now = now_ms()
local lapsed = rcall('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, sweep_limit)
local added = tally()
local recovered, died = {}, {}
for _, id in ipairs(lapsed) do
  rcall('ZREM', KEYS[1], id)
  local jk = base .. 'job:' .. id
  local row = hmget(jk, 'state', 'group', 'attempts', 'cancel') or {}
  local g = row[2]
  if g then
    free_slot(base, g)
    tally_add(added, g, 0)
  end
  if row[1] and row[4] then
    -- D22: its holder was asked to stop; the job does not run again (compose.lua).
    end_cancelled(base, id, jk, g, row[4], row[3], now)
    died[#died + 1] = id
  elseif row[1] then
    -- A stall count that is not an integer (planted, corrupted) restarts at this stall: an
    -- error here would abort the sweep after the ZREM above and leave the job in no set.
    local stalled = redis.pcall('HINCRBY', jk, 'stalled', 1)
    if type(stalled) ~= 'number' then
      stalled = 1
      rcall('HSET', jk, 'stalled', stalled)
    end
    if stalled >= max_stalled then
      rcall('HSET', jk, 'state', 'dead', 'last_error', 'stalled')
      rcall('HDEL', jk, 'lease_epoch')
      dead_letter(base, id, now)
      bump_metrics(base, 'failed', 1, now)
      emit_in(base, 'dead', id, g, 'error', 'stalled', 'stalled', stalled)
      release_dedup(base, id, jk)
      local flow = flow_parent(jk)  -- D18 (include/compose.lua)
      if flow then flow_child_dead(base, id, flow, 'stalled') end
      -- D17: the row holds no keep time, so, as cancel does, the outcome "stalled" is kept
      -- for 60 s only for a waiter already waiting: it learns the job will never finish.
      if rcall('EXISTS', base .. 'want:' .. id) == 1 then
        keep_outcome(base, id, 'error', 'stalled', row[3], 60000, now)
      end
      died[#died + 1] = id
    else
      park(base, id, jk, g)
      emit_in(base, 'stalled', id, g, 'stalled', stalled)
      local key = g or FLAT
      tally_add(added, key, 1)
      recovered[#recovered + 1] = id
    end
  end
end
-- Every lane that lost an active job is synced: a freed slot may make it serviceable again.
touch_all(base, added)
trim_dead(base, now)  -- keep_dead (include/history.lua)
return {recovered, died}
