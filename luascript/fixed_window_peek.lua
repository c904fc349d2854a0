#!lua flags=no-writes
-- Reads one fixed window without writing anything, not even a missing TTL.
-- The flags line lets Redis run it on a replica; see scripts.go.
--
-- KEYS[1]  window hash
-- ARGV[1]  limit          canonical decimal, 1..MAX_LIMIT
-- ARGV[2]  window_ms      canonical decimal, 1..MAX_WINDOW_MS
-- ARGV[3]  strict         "1": a live window with another policy is POLICY
--
-- Reply {exists, used, pttl_ms}, integers only; pttl_ms is -1 for a window
-- without a TTL (the next take restores it) and 0 when there is no window.
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
if not dec(window_s, 1, MAX_WINDOW_MS) then
  return fail('INVALID', 'window_ms must be a decimal in 1..' .. MAX_WINDOW_MS)
end
if strict ~= '0' and strict ~= '1' then
  return fail('INVALID', 'strict must be 0 or 1')
end

local f = redis.pcall('HMGET', key, 'used', 'policy')
if f.err then
  return failed_read('window', f)
end
local pttl = redis.call('PTTL', key)
if pttl == -2 then
  return {0, 0, 0}
end

local used = dec(f[1], 0, MAX_LIMIT)
local policy = limit_s .. ':' .. window_s
-- The stored policy is well formed when it is this call's (the usual case).
if not used or f[2] ~= policy and (type(f[2]) ~= 'string' or not string.find(f[2], '^%d+:%d+$')) then
  return fail('WRONGTYPE', NOT_OURS .. 'window: a hash with other fields')
end
if strict == '1' and f[2] ~= policy then
  return fail('POLICY', 'live window has limit:window_ms ' .. f[2])
end
return {1, used, pttl}
