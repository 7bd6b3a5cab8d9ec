--[[ resume_lane: lane g is served again (back in the ring when it has claimable work).
  KEYS[1] paused    SET   emq:{q}:paused
  ARGV[1] base            emq:{q}:
  ARGV[2] g
  Returns 1
  Flags: writes replay
]]
--@include common
rcall('SREM', KEYS[1], ARGV[2])
touch(ARGV[1], ARGV[2], 0)
return 1
