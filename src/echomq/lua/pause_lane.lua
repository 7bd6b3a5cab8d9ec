--[[ pause_lane: take lane g out of the ring; its backlog and in-flight jobs are untouched.
  KEYS[1] paused    SET   emq:{q}:paused
  ARGV[1] base            emq:{q}:
  ARGV[2] g
  Returns 1
  Flags: writes replay
]]
--@include common
-- Only a real change emits: a resent pause_lane (Flags: replay) adds nothing.
if rcall('SADD', KEYS[1], ARGV[2]) == 1 then emit(ARGV[1], 'paused', false, 'group', ARGV[2]) end
sync(ARGV[1], ARGV[2])
return 1
