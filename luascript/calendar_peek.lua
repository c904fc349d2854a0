#!lua flags=no-writes
-- Reads one calendar window without writing anything, not even a missing
-- TTL. The flags line lets Redis run it on a replica; see scripts.go.
--
-- KEYS[1..3]  as for calendar_take.lua
-- ARGV[1]     limit     canonical decimal, 1..MAX_LIMIT
-- ARGV[2]     strict    "1": a live window with another policy is POLICY
-- ARGV[3]     spec      as for calendar_take.lua
-- ARGV[4..7]  edges     as for calendar_take.lua
--
-- Reply {exists, used, reset_ms}, integers only; reset_ms is until the end
-- of the period holding Redis's TIME, window or not. CLOCK_SKEW as for the
-- take.
--
-- It never writes, so no error reply follows a write; Redis refuses any
-- write it tried (no-writes).

local MAX_PERIOD_MS = 32 * 86400000

if #KEYS ~= 3 or #ARGV ~= 7 then
  return fail('INVALID', 'want 3 keys and 7 arguments')
end
local limit_s, strict, spec = ARGV[1], ARGV[2], ARGV[3]
if not dec(limit_s, 1, MAX_LIMIT) then
  return fail('INVALID', 'limit must be a decimal in 1..' .. MAX_LIMIT)
end
if strict ~= '0' and strict ~= '1' then
  return fail('INVALID', 'strict must be 0 or 1')
end
if #spec > 128 or string.sub(spec, 1, #limit_s + 1) ~= limit_s .. ':'
    or not string.match(spec, '^[0-9]+:[a-z]+:[A-Za-z0-9_/+%-]+:[a-z-]+:[0-9]+$') then
  return fail('INVALID', 'spec must be limit:period:zone:week_start:jitter_ms')
end
local edges = {}
for i = 1, 4 do
  edges[i] = dec(ARGV[3 + i], 0, MAX_EXACT)
  if not edges[i] or (i > 1 and (edges[i] <= edges[i - 1] or edges[i] - edges[i - 1] > MAX_PERIOD_MS)) then
    return fail('INVALID', 'edges must be 4 increasing decimals, at most ' .. MAX_PERIOD_MS .. ' ms apart')
  end
end

local _, now = redis_now()
local p
for i = 1, 3 do
  if edges[i] <= now and now < edges[i + 1] then
    p = i
  end
end
if not p then
  return fail('CLOCK_SKEW', 'redis time ' .. now .. ' ms is outside the periods from ' ..
    edges[1] .. ' to ' .. edges[4] .. ': the sidecar clock is more than a period away from redis')
end
local key, reset = KEYS[p], edges[p + 1] - now

local f = redis.pcall('HMGET', key, 'used', 'policy')
if f.err then
  return failed_read('window', f)
end
if not f[1] and not f[2] and redis.call('EXISTS', key) == 0 then
  return {0, 0, reset}
end
local used = dec(f[1], 0, MAX_LIMIT)
if not used or type(f[2]) ~= 'string' or not string.match(f[2], '^[0-9]+:[a-z]+:') then
  return fail('WRONGTYPE', NOT_OURS .. 'window: a hash with other fields')
end
if strict == '1' and f[2] ~= spec then
  return fail('POLICY', 'live window has limit:period:zone:week_start:jitter_ms ' .. f[2])
end
return {1, used, reset}
