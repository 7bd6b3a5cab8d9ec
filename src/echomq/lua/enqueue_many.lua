--[[ enqueue_many: admit many jobs in one call; one verdict per job, in input order.
  KEYS[1] meta      HASH  emq:{q}:meta   (pins the queue's slot for the base)
  ARGV[1] base            emq:{q}:
  ARGV[2] group           lane name, or '' for the flat set
  ARGV[3] mode            now | in | at
  ARGV[4] value           ms for 'in' / 'at'
  ARGV[5] replay_ms       how long a resend of this call may still come (0: none)
  ARGV[6] nonce           the call's nonce, the same on every resend ('' : none)
  ARGV[7] flags           letters: 'r' a resend (every copy after the first), 'f' every id
                          was minted by the client in this call (include/admit.lua); or ''
  ARGV[8] '+opt'          the option tail's marker (include/args.lua opt_pairs; PROTOCOL §6)
  ARGV[9] m               how many name, value pairs follow (0: none, the lean call), each
                          name at most once, any order; a name not below is refused
                          (EMQARG), nothing written:
    priority       0..2097152 (2^21) for every job of the call, lower runs first; absent or
                   0: the default, no row field (include/admit.lua)
    ttl_ms         > 0: every job of the call expires ttl_ms after it on the server clock
                   (row field `expires`, issue 24); '' or absent: never
    keep_logs      1..MAX_ARG: every job of the call keeps its newest keep_logs log lines
                   (row field `keep_logs`, add_log.lua); absent: every line, no field
  ARGV[10..] the m pairs, then id, payload, id, payload, ...
    The positional form of 0.6 and before (ARGV[8] priority, ARGV[9] ttl_ms, the jobs from
    ARGV[10]; ARGV[8] never '+opt') is still taken, as EMQ.ENQUEUE takes it from 0.6.
  Returns {verdict, ...}: 'enqueued' | 'scheduled' | 'duplicate' | 'kind' per job; a resend
    whose first copy landed answers that copy's verdicts, 'replayed' / 'replayed:scheduled'
    for the admitted ones (admit.lua). An id named twice in one call: the Python side sends
    it once.
  Flags: writes once
  Native: EMQ.ENQUEUE args=9+2n deny-oom
]]
--@include common
--@include args
--@include admit
local ARITY = 'ERR EMQ.ENQUEUE takes 2 keys (row, meta) and 6..24 args (enqueue) or 1 key (meta) and 9 + 2n args (enqueue_many)'
shape(1, 9, nil, ARITY)
if (#ARGV - 9) % 2 ~= 0 then refuse(ARITY) end
-- The options, parsed once: the named tail, or the positional form (0.6).
local o, first = nil, 10  -- first: the first job's id
if ARGV[8] == OPT_TAIL then
  local m = int_arg(ARGV[9])
  if m < 0 or 9 + 2 * m > #ARGV then refuse(ARITY) end
  o = opt_pairs(10, 8 + 2 * m, {priority = 1, ttl_ms = 1, keep_logs = 1})
  first = 10 + 2 * m
else
  o = {priority = ARGV[8], ttl_ms = ARGV[9]}
end
int_arg(ARGV[5])
local pri = 0
if o.priority then pri = priority_arg(o.priority) end
local ttl = o.ttl_ms or ''
if ttl ~= '' then int_arg(ttl) end
local keep = nil
if o.keep_logs then keep = keep_logs_arg(o.keep_logs) end
if ARGV[3] == 'in' or ARGV[3] == 'at' then int_arg(ARGV[4]) end
local base = ARGV[1]
local g = ARGV[2]
if g == '' then g = false end
local replay_ms, nonce = tonumber(ARGV[5]), ARGV[6]
local marked = replay_ms > 0 and nonce ~= ''
local flags = ARGV[7]
if marked and string.find(flags, 'r', 1, true) then
  local again = find_many(base, nonce)
  if again then return again end
end
local now = now_ms()
local run_at = run_time(ARGV[3], ARGV[4], now)
local expires = nil
if ttl ~= '' then expires = now + tonumber(ttl) end
local out = {}
local added, admitted = 0, 0
local fresh = string.find(flags, 'f', 1, true) ~= nil
local due_list = {}  -- the due jobs' (score, id): one ZADD after the rows (include/admit.lua)
for i = first, #ARGV, 2 do
  local verdict = admit(base, ARGV[i], ARGV[i + 1], g, run_at, now, fresh, pri, expires, due_list,
    keep)
  if verdict == 'enqueued' then added = added + 1 end
  if verdict == 'enqueued' or verdict == 'scheduled' then admitted = admitted + 1 end
  if verdict == 'duplicate' then emit_in(base, 'duplicate', ARGV[i], g) end
  out[#out + 1] = verdict
end
-- One ring/registry sync for the whole batch: every job went to the same waiting set.
if added > 0 then
  due_flush(base, g, due_list)
  touch(base, g, added)
end
-- After the admissions: the call's first write is a row's HSET (see admit.lua).
-- A call that admitted nothing wrote nothing, and leaves nothing (its resend answers the same).
if marked and admitted > 0 then mark_many(base, nonce, out, replay_ms) end
return out
