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
  ARGV[4] completes       how many (id, token) pairs follow
  ARGV[5..] id, token per complete; then id, token, delay_ms, max_attempts, error per retry
  Returns {{complete verdict...}, {retry verdict...}, {{id, payload, attempts, group|nil}...}}
    complete verdict: 1 | 0 (gone) | 'EMQSTALE ...'; retry verdict: 'scheduled' | 'dead' |
    0 (gone) | 'EMQSTALE ...'
  Flags: writes once
]]
--@include common
--@include fence
--@include settle
--@include lease
local base = ARGV[1]
local i, completed = complete_many(base, ARGV, 5, tonumber(ARGV[4]))
local now = now_ms()
local retried = {}
while i <= #ARGV do
  local id = ARGV[i]
  retried[#retried + 1] = retry_one(base, id, base .. 'job:' .. id, ARGV[i + 1],
    tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3]), ARGV[i + 4], now)
  i = i + 5
end
local jobs = {}
local n = tonumber(ARGV[3])
if n > 0 and rcall('HEXISTS', KEYS[1], 'paused') == 0 then
  claim_n(base, now + tonumber(ARGV[2]), n, jobs)
end
return {completed, retried, jobs}
