#!lua flags=no-writes
-- Reads one fixed window without writing anything, not even a missing TTL.
-- The flags line lets Redis run it on a replica; see scripts.go.
--
-- KEYS[1]  window hash
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {exists, used, remaining, pttl_ms}, integers only, as every
-- peek's (ParsePeek); pttl_ms is -1 for a window
-- without a TTL (the next take restores it) and 0 when there is no window.
--
-- It never writes, so no error reply follows a write; Redis refuses any
-- write it tried (no-writes).

--#args

local f = redis.pcall('HMGET', key, 'used', 'policy')
if f.err then
  return failed_read('window', f)
end
local pttl = redis.call('PTTL', key)
if pttl == -2 then
  return {0, 0, limit, 0}
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
return {1, used, limit > used and limit - used or 0, pttl}
