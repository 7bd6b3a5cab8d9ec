--[[ settle: the worker's round trip. Complete and retry finished jobs (each fenced on its own
  token, exactly as complete and retry do), then claim up to n more on one lease.
  KEYS[1] meta      HASH  emq:{q}:meta   (the pause flag gates the claim part)
  KEYS[2] ring      LIST  emq:{q}:ring
  KEYS[3] active    ZSET  emq:{q}:active
  KEYS[4] schedule  ZSET  emq:{q}:schedule
  KEYS[5] dead      ZSET  emq:{q}:dead
  ARGV[1] base            emq:{q}:
  ARGV[2] lease_ms        > 0
  ARGV[3] n               jobs to claim, >= 0
  ARGV[4] completes       how many (id, token) pairs follow, or 'c:r': c pairs, the last r of
                          which keep a result, then r (result, keep_result_ms) pairs (D17)
  ARGV[5..] id, token per complete; then id, token, delay_ms, max_attempts, error per retry
    (max_attempts may be 'max:keep_ms': a dead-letter then keeps its error, D17)
  Returns {{complete verdict...}, {retry verdict...}, {{id, payload, attempts, group|nil}...},
    wait, held}: wait is 0, or, when the claim part got nothing because a rate limit holds jobs
    back, the ms until its window reopens (D21, include/lease.lua rate_wait); held is 1 when
    a claim was asked and the queue-wide limit leaves no room after it while work waits
    (D24, issue 41: the worker's next settles claim the room they free), else 0
    Under a queue-wide limit, settles that free room pushes a wake token per freed slot
    still open while a waiting set is serviceable (issue 37).
    complete verdict: 1 | 0 (gone) | 'EMQSTALE ...'; retry verdict: 'scheduled' | 'dead' |
    0 (gone) | 'EMQSTALE ...'
  Flags: writes once
  Native: EMQ.SETTLE args=4..
]]
--@include common
--@include args
--@include fence
--@include control
--@include compose
--@include settle
--@include lease
--@cold expire_job
shape(5, 4, nil, 'ERR EMQ.SETTLE takes 5 keys (meta, ring, active, schedule, dead) and at least 4 args (settle)')
local lease_ms, want = int_arg(ARGV[2]), int_arg(ARGV[3])
local nc, nr = count_pair(ARGV[4], "ERR EMQ.SETTLE completes must be 'c' or 'c:r' (decimal counts)")
nr = nr or 0
do
  local tail = #ARGV - 4
  if nr > nc or nc > math.floor(tail / 2) or 2 * nc + 2 * nr > tail or (tail - 2 * nc - 2 * nr) % 5 ~= 0 then
    refuse('ERR EMQ.SETTLE args do not fit: c (id, token) pairs, r (result, keep_result_ms) pairs, then 5 args per retry')
  end
  for j = 1, nr do int_arg(ARGV[5 + 2 * nc + 2 * (j - 1) + 1]) end
  for at = 5 + 2 * nc + 2 * nr, #ARGV, 5 do
    int_arg(ARGV[at + 2])
    count_pair(ARGV[at + 3], ERR_NUM)
  end
end
local base = ARGV[1]
-- One read of meta first: the pause flag for the claim part, and the events bound that every
-- completion's emit would otherwise read (common.lua claim_gate).
local paused = claim_gate(base)
-- The last nr of the nc pairs keep a result (D17): their (result, keep_result_ms) pairs follow
-- the nc pairs. They settle in the same batch as the others; then their results are kept.
local results = nil
if nr > 0 then
  results = {}
  for j = 1, nr do
    results[ARGV[5 + 2 * (nc - nr + j - 1)]] = ARGV[5 + 2 * nc + 2 * (j - 1)]
  end
end
local now = now_ms()
local i, completed = complete_many(base, ARGV, 5, nc, results, now, kept_specs.keep_completed)
for j = 1, nr do
  local at = 5 + 2 * (nc - nr + j - 1)
  if completed[nc - nr + j] == 1 then
    keep_outcome(base, ARGV[at], 'result', ARGV[i], ARGV[at + 1], tonumber(ARGV[i + 1]), now)
  end
  i = i + 2
end
local retried = {}
while i <= #ARGV do
  local id = ARGV[i]
  local max, keep = string.match(ARGV[i + 3], '^(%d+):?(%d*)$')
  retried[#retried + 1] = retry_one(base, id, base .. 'job:' .. id, ARGV[i + 1],
    tonumber(ARGV[i + 2]), tonumber(max), ARGV[i + 4], now, tonumber(keep))
  i = i + 5
end
trim_dead(base, now)  -- keep_dead, after this call's dead-letters (include/history.lua)
local jobs = {}
local n = want
local wait = 0
if n > 0 and not paused then
  claim_n(base, now + lease_ms, n, jobs, now)
  if #jobs == 0 then wait = rate_wait(base, now) end
end
-- Issue 37: under a queue-wide limit, a worker whose claim came back short parks on the wake
-- list, and the room this call's settles free is not its own claim's to take (the claim
-- part above took what it asked for). Wake a parked claimer for each freed slot still
-- open while work waits (the ring holds exactly the serviceable sets), so the room is taken
-- at once instead of at the next beat. No limit: no wake, a settle costs what it did.
-- Issue 41: a claim that leaves the queue at its queue-wide limit while jobs wait says so
-- (held), so the worker claims with the settles that free room instead of parking until a
-- wake token comes back to it.
local held = 0
if qlimit and not paused and n > 0 then
  if qlimit - rcall('ZCARD', base .. 'active') <= 0 and rcall('SCARD', base .. 'inring') > 0 then
    held = 1
  end
end
if qlimit and not paused then
  local freed = 0
  for _, v in ipairs(completed) do if v == 1 then freed = freed + 1 end end
  for _, v in ipairs(retried) do
    if v == 'scheduled' or v == 'dead' or v == 'removed' then freed = freed + 1 end
  end
  if freed > 0 then
    local room = qlimit - rcall('ZCARD', base .. 'active')
    if room > 0 and rcall('SCARD', base .. 'inring') > 0 then wake(base, math.min(freed, room)) end
  end
end
return {completed, retried, jobs, wait, held}
