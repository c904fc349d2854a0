#!lua flags=no-writes
-- Reads one sliding window without writing anything, not even a missing
-- TTL. The flags line lets Redis run it on a replica; see scripts.go. The
-- arithmetic is the prelude's sliding_window, as for sliding_window_take.lua.
--
-- KEYS[1]  window hash
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {exists, used, remaining, reset_ms}, integers only, as every
-- peek's: used is the estimate now, rounded up, and reset_ms until the
-- whole use has slid out (0 for none, or no window).
--
-- It never writes, so no error reply follows a write; Redis refuses any
-- write it tried (no-writes).

--#args

local _, now = redis_now()

local f = redis.pcall('HMGET', key, 's', 'c', 'p', 'policy')
if f.err then
  return failed_read('sliding window', f)
end
if redis.call('EXISTS', key) == 0 then
  return {0, 0, limit, 0}
end
local s = dec(f[1], 0, MAX_EXACT)
local c = dec(f[2], 0, MAX_LIMIT)
local p = dec(f[3], 0, MAX_LIMIT)
local stored = f[4] and dec(string.match(f[4], '^%d+:(%d+)$'), 1, MAX_WINDOW_MS)
if not (s and c and p and stored) then
  return fail('WRONGTYPE', NOT_OURS .. 'sliding window: a hash with other fields')
end
if strict == '1' and f[4] ~= limit_s .. ':' .. window_s then
  return fail('POLICY', 'live window has limit:window_ms ' .. f[4])
end
local sw = sliding_window(window)
local prev, cur, start, elapsed = sw.state(now, s, c, p, stored)
local used = sw.share(prev, elapsed) + cur
return {1, used, limit > used and limit - used or 0, sw.reset(now, prev, cur, start)}
