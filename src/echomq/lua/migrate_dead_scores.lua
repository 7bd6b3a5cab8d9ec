--[[ migrate_dead_scores: one batch of the migration `dead-scores` (from layout 1, issue 39).
  echomq <= 0.3 scored a dead-letter 0; since 0.4 `dead` is scored by the time of death (D25),
  so the first age-bounded trim (`keep_dead(age_ms=...)`) would delete every old dead-letter
  at once. This rescores up to `batch` members still at score 0 to now: a <= 0.3 row records
  no time of death, so the migration's time stands for it (the age bound then keeps them that
  long from the migration). Atomic per batch, so a worker of any release dead-lettering or
  trimming beside it sees each member either at 0 or at its new score; a member rescored
  leaves the 0 range, so the range itself is the cursor: a rerun (or a run stopped after a
  batch) goes on where it stopped and rescoring nothing twice.
  KEYS[1] dead  ZSET  emq:{q}:dead
  ARGV[1] batch       > 0: at most this many members per call
  Returns {rescored, more}: the members rescored by this call; 1 when some are still at score
    0, else 0 (ZRANGEBYSCORE, not ZCOUNT: the least-privilege ACL of RELIABILITY.md grants
    it, and a script's commands are checked against the caller's ACL too)
  Flags: writes replay
]]
--@include common
local batch = tonumber(ARGV[1])
if not batch or batch < 1 or batch ~= math.floor(batch) then
  return redis.error_reply('ERR migrate_dead_scores: batch must be a positive integer')
end
local found = rcall('ZRANGEBYSCORE', KEYS[1], 0, 0, 'LIMIT', 0, batch)
if #found > 0 then
  local now = now_ms()
  local args = {}
  for i, id in ipairs(found) do
    args[2 * i - 1] = now
    args[2 * i] = id
  end
  rcall('ZADD', KEYS[1], 'XX', unpack(args))
end
return {#found, #rcall('ZRANGEBYSCORE', KEYS[1], 0, 0, 'LIMIT', 0, 1)}
