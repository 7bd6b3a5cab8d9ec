--[[ resume_lane: lane g is served again (back in the ring when it has claimable work).
  KEYS[1] paused    SET   emq:{q}:paused
  ARGV[1] base            emq:{q}:
  ARGV[2] g
  Returns 1
  Flags: writes replay
]]
--@include common
-- Only a real change emits: a resent resume_lane (Flags: replay) removes nothing.
if rcall('SREM', KEYS[1], ARGV[2]) == 1 then emit(ARGV[1], 'resumed', false, 'group', ARGV[2]) end
touch(ARGV[1], ARGV[2], 0)
return 1
