--[[ enqueue: -> pending (or its lane), or -> schedule when delayed. Idempotent by id.
  KEYS[1] row       HASH  emq:{q}:job:<id>
  KEYS[2] meta      HASH  emq:{q}:meta   (pins the queue's slot for the base)
  ARGV[1] base            emq:{q}:
  ARGV[2] id              a branded id; only JOB ids are admitted (EMQKIND)
  ARGV[3] payload         opaque bytes, stored verbatim
  ARGV[4] group           lane name, or '' for the flat set
  ARGV[5] mode            now | in | at
  ARGV[6] value           ms: a delay for 'in', an absolute unix ms for 'at'
  ARGV[7] flags           letters: 'f' the client minted the id in this call (it was never
                          handed out: no retired record to read, include/admit.lua), 'r' a
                          resend (every copy after the first), 'x' set the replay marker
                          key's TTL (the client's first marker in that key, admit.lua);
                          '' for none
  ARGV[8] replay_ms       optional: how long a resend of this call may still come (0: none)
  ARGV[9] nonce           optional: the call's nonce, the same on every resend ('' : none;
                          a minted id due now with 0 < replay_ms <= 70000 sends none: its id
                          is its marker, include/admit.lua)
  ARGV[10..] the option tail, optional: '+opt' then name, value pairs (include/args.lua
                          opt_pairs; PROTOCOL §6), each name at most once, any order; a
                          name not below is refused (EMQARG), nothing written:
    dedup          a dedup id (D20, include/control.lua); '' : none
    dedup_mode     simple | throttle | debounce
    dedup_ttl_ms   the key's TTL (throttle, debounce); 0 for simple. Needed with a dedup
    second         the client's unix second that names the replay marker's key (the same
                   on every resend); absent: the server's, and the TTL is always set
    priority       0..2097152 (2^21), lower runs first; absent or 0: the default, no row
                   field (include/admit.lua)
    ttl_ms         > 0, the job expires ttl_ms after this call on the server clock (row
                   field `expires`, issue 24); '' or absent: never
    keep_logs      1..MAX_ARG: the job keeps its newest keep_logs log lines (row field
                   `keep_logs`, read by add_log.lua); absent: every line, no row field
    A call with no option sends no tail (the lean call: 7..9 args). The positional form of
    0.6 and before (ARGV[10] dedup, [11] dedup_mode, [12] dedup_ttl_ms, [13] second, [14]
    priority, [15] ttl_ms, each optional from the end; ARGV[10] never '+opt') is still
    taken, as EMQ.ENQUEUE takes it from a 0.6 client.
  Returns 'enqueued' | 'scheduled' | 'duplicate' | 'replayed' / 'replayed:scheduled' (a
    resend whose first copy landed, and what that copy answered) | 'deduplicated:<holder id>'
    | error EMQKIND
  Flags: writes once
  Native: EMQ.ENQUEUE args=6..24 deny-oom
]]
-- The plain enqueue first (issue 28, "a lean enqueue"): a minted id, due now, no lane, no
-- dedup, priority or expiry, no nonce (its id is its replay marker, include/admit.lua), not
-- a resend, into a non-empty flat set. It runs before any
-- include is defined, so the call builds no closure: in a script, every `local function`
-- is built anew on each call, and a single enqueue spent more time building them (and
-- collecting them) than in its writes. It writes exactly what the general path below
-- writes for these inputs, in the same order (row, waiting set, event, wake), and
-- leaves every other case to it -- an empty flat set (the ring's resync), a taken id, a
-- malformed call (so the errors stay the general path's). The model test drives this path
-- on both executors (tests/model); EMQ.ENQUEUE has no closures to skip.
if #KEYS == 2 and #ARGV >= 7 and #ARGV <= 13 then
  local call, base, id, flags = redis.call, ARGV[1], ARGV[2], ARGV[7]
  local rm = ARGV[8] or '0'
  local open = string.find(base, '{', 1, true)
  local close = open and string.find(base, '}', open + 1, true)
  local jk = base .. 'job:' .. id
  if close and close > open + 1 and KEYS[1] == jk and string.sub(KEYS[2], 1, #base) == base
    and ARGV[5] == 'now' and ARGV[4] == '' and flags == 'f' and (ARGV[9] or '') == ''
    and (ARGV[10] or '') == '' and string.sub(id, 1, 3) == 'JOB'
    and string.match(rm, '^%d+$') and #rm <= 15
    and call('ZCARD', base .. 'pending') > 0 and call('EXISTS', jk) == 0 then
    call('HSET', jk, 'state', 'pending', 'attempts', '0', 'payload', ARGV[3])
    call('ZADD', base .. 'pending', 0, id)
    local bound = call('HGET', base .. 'meta', 'events')
    if bound then
      call('XADD', base .. 'events', 'MAXLEN', '~', bound, '*', 'event', 'enqueued', 'id', id)
    end
    if call('LLEN', base .. 'wake') < 64 then call('LPUSH', base .. 'wake', '1') end
    return 'enqueued'
  end
end
--@include common
--@include args
--@include admit
--@include control
-- Built on first use (protocol/scripts.py): a ring resync (the first job into an empty set or lane)
-- and the retired record (an id the caller named, or a resend's).
--@cold sync retired_last unretire
local ARITY = 'ERR EMQ.ENQUEUE takes 2 keys (row, meta) and 6..24 args (enqueue) or 1 key (meta) and 9 + 2n args (enqueue_many)'
shape(2, 6, 24, ARITY)
-- The options, parsed once: the named tail, or the positional form (0.6), or none.
local o
if ARGV[10] == OPT_TAIL then
  if #ARGV % 2 ~= 0 then refuse(ARITY) end  -- a name without its value
  o = opt_pairs(11, #ARGV, {dedup = 1, dedup_mode = 1, dedup_ttl_ms = 1, second = 1,
    priority = 1, ttl_ms = 1, keep_logs = 1})
else
  if #ARGV > 15 then refuse(ARITY) end
  o = {}
  for i, name in ipairs({'dedup', 'dedup_mode', 'dedup_ttl_ms', 'second', 'priority', 'ttl_ms'}) do
    o[name] = ARGV[9 + i]
  end
end
if ARGV[8] then int_arg(ARGV[8]) end
local did = o.dedup or ''
if did ~= '' then int_arg(o.dedup_ttl_ms) end
if ARGV[5] == 'in' or ARGV[5] == 'at' then int_arg(ARGV[6]) end
local pri = 0
if o.priority then pri = priority_arg(o.priority) end
local ttl = o.ttl_ms or ''
if ttl ~= '' then int_arg(ttl) end
local keep = nil
if o.keep_logs then keep = keep_logs_arg(o.keep_logs) end
local base, id = ARGV[1], ARGV[2]
local g = ARGV[4]
if g == '' then g = false end
local flags = ARGV[7] or ''
local replay_ms, nonce = tonumber(ARGV[8] or '0'), ARGV[9] or ''
local resend = string.find(flags, 'r', 1, true) ~= nil
-- The clock is read only when the job has a run time (D10: server clock for 'in'), a dedup
-- key, or a replay marker whose client named no second (admit.lua).
local second = o.second
local now = 0
if ARGV[5] ~= 'now' or did ~= '' or ttl ~= '' or (nonce ~= '' and not second) then now = now_ms() end
local expires = nil
if ttl ~= '' then expires = now + tonumber(ttl) end
-- Policy first (admit checks it too): a refused call writes nothing.
local KIND = 'EMQKIND job id must be JOB-namespaced'
if string.sub(id, 1, 3) ~= 'JOB' then return redis.error_reply(KIND) end
local fresh = string.find(flags, 'f', 1, true) ~= nil
-- The id is the marker (admit.lua): a resend of a minted id, due now, sent without a nonce
-- within ID_REPLAY_MS landed before if its row holds this call's payload, or if the id was
-- deleted (retired) since. A row with another payload is another call's (two minters' ids
-- collided): the admission below answers 'duplicate' and the client mints anew.
if resend and fresh and nonce == '' and ARGV[5] == 'now' and replay_ms > 0
  and replay_ms <= ID_REPLAY_MS then
  local jk = base .. 'job:' .. id
  if rcall('EXISTS', jk) == 1 then
    if rcall('TYPE', jk).ok == 'hash' and rcall('HGET', jk, 'payload') == ARGV[3] then
      return 'replayed'
    end
  elseif select(2, retired_last(base, id)) then
    return 'replayed'
  end
end
local mk, mf  -- the replay marker's key and field (admit.lua)
if nonce ~= '' and replay_ms > 0 then
  mk, mf = marker_of(base, id, nonce, ARGV[8], second or math.floor(now / 1000))
  if resend then
    local again = find_one(mk, mf)
    if again then return again end
  end
end
local run_at = run_time(ARGV[5], ARGV[6], now)
if did ~= '' then
  local holder, other, lane = dedup_holder(base, did, o.dedup_mode, ARGV[3], run_at, now, g, pri,
    expires, keep)
  if other then
    if lane == '' then lane = 'no lane' else lane = 'lane ' .. lane end
    return redis.error_reply('EMQSTATE debounce holder ' .. other .. ' waits in ' .. lane
      .. ': a fold cannot move it to another lane')
  end
  if holder then
    -- D15: the refused enqueue is an event too; `id` is the holder that took it.
    emit(base, 'deduplicated', holder, 'dedup', did, 'refused', id)
    return 'deduplicated:' .. holder
  end
end
local verdict = admit(base, id, ARGV[3], g, run_at, now, fresh, pri, expires, nil, keep)
if verdict == 'kind' then return redis.error_reply(KIND) end
if verdict == 'duplicate' then emit_in(base, 'duplicate', id, g) end
if did ~= '' and verdict ~= 'duplicate' then take_dedup(base, id, did, tonumber(o.dedup_ttl_ms)) end
if verdict == 'enqueued' then touch(base, g, 1) end
-- After the admission: the call's first write is the row's HSET (see admit.lua).
if mk and verdict ~= 'duplicate' then
  mark_one(mk, mf, verdict, replay_ms, not second or string.find(flags, 'x', 1, true) ~= nil)
end
return verdict
