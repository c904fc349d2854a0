#!lua flags=no-writes
-- Reads one sliding window without writing anything, not even a missing
-- TTL. The flags line lets Redis run it on a replica; see scripts.go. The
-- arithmetic is the prelude's sliding_window, as for sliding_window_take.lua.
--
-- KEYS[1]  window hash
-- ARGV[1]  limit          canonical decimal, 1..MAX_LIMIT
-- ARGV[2]  window_ms      canonical decimal, 1..MAX_WINDOW_MS
-- ARGV[3]  strict         "1": a live window with another policy is POLICY
--
-- Reply {used, reset_ms}, integers only: the estimate now, rounded up, and
-- ms until the whole use has slid out (0 for none, or no window).
--
-- It never writes, so no error reply follows a write; Redis refuses any
-- write it tried (no-writes).

if #KEYS ~= 1 or #ARGV ~= 3 then
  return fail('INVALID', 'want 1 key and 3 arguments')
end
local key = KEYS[1]
local limit_s, window_s, strict = ARGV[1], ARGV[2], ARGV[3]

if not dec(limit_s, 1, MAX_LIMIT) then
  return fail('INVALID', 'limit must be a decimal in 1..' .. MAX_LIMIT)
end
local window = dec(window_s, 1, MAX_WINDOW_MS)
if not window then
  return fail('INVALID', 'window_ms must be a decimal in 1..' .. MAX_WINDOW_MS)
end
if strict ~= '0' and strict ~= '1' then
  return fail('INVALID', 'strict must be 0 or 1')
end

local _, now = redis_now()

local f = redis.pcall('HMGET', key, 's', 'c', 'p', 'policy')
if f.err then
  return failed_read('sliding window', f)
end
if redis.call('EXISTS', key) == 0 then
  return {0, 0}
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
return {sw.share(prev, elapsed) + cur, sw.reset(now, prev, cur, start)}
