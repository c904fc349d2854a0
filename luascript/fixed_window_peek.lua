#!lua flags=no-writes
-- Reads one fixed window without writing anything, not even a missing TTL.
-- The flags line lets Redis run it on a replica; see scripts.go.
--
-- KEYS[1]  window hash
-- ARGV[1]  limit          canonical decimal, 1..1000000000
-- ARGV[2]  window_ms      canonical decimal, 1..2678400000
-- ARGV[3]  strict         "1": a live window with another policy is POLICY
--
-- Reply {exists, used, pttl_ms}, integers only; pttl_ms is -1 for a window
-- without a TTL (the next take restores it) and 0 when there is no window.

if #KEYS ~= 1 or #ARGV ~= 3 then
  return redis.error_reply('INVALID want 1 key and 3 arguments')
end
local key = KEYS[1]
local limit_s, window_s, strict = ARGV[1], ARGV[2], ARGV[3]

-- Same as in fixed_window_take.lua.
local function dec(s, lo, hi)
  if type(s) ~= 'string' or #s > 10 or not (s == '0' or string.match(s, '^[1-9][0-9]*$')) then
    return nil
  end
  local n = tonumber(s)
  if n < lo or n > hi then
    return nil
  end
  return n
end

if not dec(limit_s, 1, 1000000000) then
  return redis.error_reply('INVALID limit must be a decimal in 1..1000000000')
end
if not dec(window_s, 1, 2678400000) then
  return redis.error_reply('INVALID window_ms must be a decimal in 1..2678400000')
end
if strict ~= '0' and strict ~= '1' then
  return redis.error_reply('INVALID strict must be 0 or 1')
end

-- As in fixed_window_take.lua: one read, and our own WRONGTYPE wording.
local f = redis.pcall('HMGET', key, 'used', 'policy')
if f.err then
  if string.sub(f.err, 1, 10) == 'WRONGTYPE ' then
    return redis.error_reply('WRONGTYPE key is not a quotad window: it holds another type')
  end
  return f
end
local pttl = redis.call('PTTL', key)
if pttl == -2 then
  return {0, 0, 0}
end

local used = dec(f[1], 0, 1000000000)
if not used or type(f[2]) ~= 'string' or not string.match(f[2], '^[0-9]+:[0-9]+$') then
  return redis.error_reply('WRONGTYPE key is not a quotad window: a hash with other fields')
end
if strict == '1' and f[2] ~= limit_s .. ':' .. window_s then
  return redis.error_reply('POLICY live window has limit:window_ms ' .. f[2])
end
return {1, used, pttl}
