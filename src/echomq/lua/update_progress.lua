--[[ update_progress: set the row's progress and emit a progress event (D15).
  KEYS[1] row       HASH  emq:{q}:job:<id>
  ARGV[1] base            emq:{q}:   (events go to emq:{q}:events)
  ARGV[2] id
  ARGV[3] value
  Returns 1 | 0 when gone
  Flags: writes replay
]]
--@include common
if rcall('EXISTS', KEYS[1]) == 0 then return 0 end
rcall('HSET', KEYS[1], 'progress', ARGV[3])
emit(ARGV[1], 'progress', ARGV[2], 'progress', ARGV[3])
return 1
