-- What a queue records about itself, written inside the transition that it describes.
--
-- D15 events: while the queue's meta hash holds `events` (the stream's approximate bound),
-- every transition appends its event to emq:{q}:events in the same script, so an event
-- exists exactly when its move happened. Events off costs one HGET per script call (cached
-- below), never a write.
--
-- D16 metrics: per-minute counts of completions and dead-letters, newest first, each element
-- "<minute>:<count>" (minute = floor(server unix seconds / 60)); see echomq/protocol/observe.py.
local events_bound = nil  -- nil: not read yet; false: off; else the MAXLEN bound

local function emit(base, event, id, ...)
  if events_bound == nil then
    events_bound = rcall('HGET', base .. 'meta', 'events') or false
  end
  if not events_bound then return end
  if id then
    rcall('XADD', base .. 'events', 'MAXLEN', '~', events_bound, '*', 'event', event, 'id', id, ...)
  else
    rcall('XADD', base .. 'events', 'MAXLEN', '~', events_bound, '*', 'event', event, ...)
  end
end

-- emit for a job that may sit in a lane: a grouped job's event names its lane.
local function emit_in(base, event, id, g, ...)
  if g and g ~= FLAT then
    emit(base, event, id, 'group', g, ...)
  else
    emit(base, event, id, ...)
  end
end

-- Count n settles of kind ('completed' | 'failed') in the current server minute: O(1), the
-- head is either this minute's element (summed in place) or a new element is pushed.
-- now (optional): the caller's server-clock ms, so a settle reads TIME once.
local function bump_metrics(base, kind, n, now)
  if n <= 0 then return end
  rcall('HINCRBY', base .. 'metrics:' .. kind, 'count', n)
  local key = base .. 'metrics:' .. kind .. ':data'
  local minute
  if now then
    minute = math.floor(now / 60000)
  else
    minute = math.floor(tonumber(rcall('TIME')[1]) / 60)
  end
  local head = rcall('LINDEX', key, 0)
  if head then
    local m, c = string.match(head, '^(%d+):(%d*)')
    if m and tonumber(m) >= minute then
      rcall('LSET', key, 0, m .. ':' .. ((tonumber(c) or 0) + n))
      return
    end
  end
  rcall('LPUSH', key, minute .. ':' .. n)
  rcall('LTRIM', key, 0, 1439)
end
