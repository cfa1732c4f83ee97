-- snapshot.lua: the room's state at TIME, writing nothing.
--
-- KEYS: as lib.lua. ARGV: none.
-- Returns {0} when the room has no state, else the snapshot reply of
-- lib.lua (active_sessions counts deadlines after now).

local now = now_ms()
local st = load()
if not st then
  return {0}
end
return snapshot(st, now, live_sessions(now))
