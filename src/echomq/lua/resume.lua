--[[ resume: let claims through again and wake parked consumers. Idempotent.
  KEYS[1] meta      HASH  emq:{q}:meta
  KEYS[2] ring      LIST  emq:{q}:ring
  ARGV[1] base            emq:{q}:
  Returns 1
  Flags: writes replay
]]
--@include common
if rcall('HDEL', KEYS[1], 'paused') == 1 then
  wake(ARGV[1], rcall('LLEN', KEYS[2]) * 8)
  emit(ARGV[1], 'resumed', false)  -- only a real change: a resent resume emits nothing
end
return 1
