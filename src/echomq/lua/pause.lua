--[[ pause: stop every claim of the queue (flat and lanes, single and batch). Idempotent.
  KEYS[1] meta      HASH  emq:{q}:meta
  Returns 1
  Flags: writes replay
]]
--@include common
-- The base is the meta key without its 'meta' suffix (KEYS[1] is emq:{q}:meta).
-- Only a real change emits: a resent pause (Flags: replay) finds the field already there.
if rcall('HSET', KEYS[1], 'paused', '1') == 1 then
  emit(string.sub(KEYS[1], 1, -5), 'paused', false)
end
return 1
