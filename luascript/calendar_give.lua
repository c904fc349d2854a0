-- Gives cost back to one calendar window, in the period holding Redis's
-- clock: its use falls by cost, never below zero. Envoy's negative hits
-- (rls/). It names no take, so it is not idempotent: sent twice, it gives
-- back twice. See doc.go for the layout.
--
-- KEYS[1..3]  as for calendar_take.lua
-- ARGV        its contract's (contract.go): limit, cost (1..MAX_LIMIT),
--             strict, spec and edges as for calendar_take.lua
--
-- Reply {exists, used, remaining, reset_ms}, integers only, as a peek's,
-- after the give back. A period without a window has nothing to give
-- back: the reply is a peek's of it, and nothing is written. Error
-- replies start with INVALID, POLICY, WRONGTYPE or CLOCK_SKEW.
--
-- No error reply follows a write: every argument is checked, the period
-- chosen and the window read before its one HSET, which never creates a
-- window and never moves its end.

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
used = used > cost and used - cost or 0
redis.call('HSET', key, 'used', used)
return {1, used, limit > used and limit - used or 0, reset}
