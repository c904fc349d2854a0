#!lua flags=no-writes
-- Reads one calendar window without writing anything, not even a missing
-- TTL. The flags line lets Redis run it on a replica; see scripts.go.
--
-- KEYS[1..3]  as for calendar_take.lua
-- ARGV        its contract's (contract.go): limit, strict, spec and edges
--             as for calendar_take.lua
--
-- Reply {exists, used, remaining, reset_ms}, integers only, as every
-- peek's; reset_ms is until the end
-- of the period holding Redis's TIME, window or not. CLOCK_SKEW as for the
-- take.
--
-- It never writes, so no error reply follows a write; Redis refuses any
-- write it tried (no-writes).

--#args
--#include calendar_period

local f = redis.pcall('HMGET', key, 'used', 'policy')
if f.err then
  return failed_read('window', f)
end
if not f[1] and not f[2] and redis.call('EXISTS', key) == 0 then
  return {0, 0, limit, reset}
end
local used = dec(f[1], 0, MAX_LIMIT)
if not used or type(f[2]) ~= 'string' or not string.match(f[2], '^[0-9]+:[a-z0-9]+:') then
  return fail('WRONGTYPE', NOT_OURS .. 'window: a hash with other fields')
end
if strict == '1' and f[2] ~= spec then
  return fail('POLICY', 'live window has limit:period:zone:week_start:jitter_ms ' .. f[2])
end
return {1, used, limit > used and limit - used or 0, reset}
