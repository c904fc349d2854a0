-- Settles an accepted take of one calendar window, in the period holding
-- Redis's clock: the take reserved the cost its record holds, and the work
-- it paid for cost this much. See doc.go for the layout.
--
-- KEYS[1..3]  the window hashes of three consecutive periods, as for
--             calendar_take.lua
-- ARGV        its contract's (contract.go): limit, cost (0..MAX_LIMIT,
--             the take's actual cost), strict, request_id (the take's),
--             spec and edges as for calendar_take.lua
--
-- Reply {settled, replay, reserved, used, remaining, reset_ms,
-- retry_after_ms, healed}, as for fixed_window_settle.lua; reset_ms is until the period's end. A
-- take of an earlier period no longer counts anywhere (takes name the key
-- of the period holding the clock), so its settle is the no-op answer,
-- settled 0. Error replies start with INVALID, CONFLICT, POLICY, WRONGTYPE
-- or CLOCK_SKEW.
--
-- A settle is never limited (used may end above the limit, and saturates
-- at MAX_LIMIT), never creates a window and never moves its end: the only
-- PEXPIRE heals a window without TTL, to its period's end, as the take
-- does.
--
-- No error reply follows a write other than a restored TTL: every argument
-- is checked and the period chosen before Redis is touched, the WRONGTYPE
-- checks of the read come before any write, and the one HSET that applies
-- the settlement (used and s:<id> together) is the last write, so a full
-- Redis (maxmemory) leaves a window as it was (but for a restored TTL) or
-- settles in full.
--
-- Records are read as "<cost>:<used>" followed by nothing or by ':' and
-- fields this script does not know, which it leaves as they are.

--#args
--#include calendar_period

--#include window_read fields='r:'..id,'s:'..id

if pttl == -2 then
  return {0, 0, 0, 0, limit, reset, 0, 0}
end

local used = dec(f[1], 0, MAX_LIMIT)
if not used or type(f[2]) ~= 'string' or not string.match(f[2], '^[0-9]+:[a-z0-9]+:') then
  return fail('WRONGTYPE', NOT_OURS .. 'window: a hash with other fields')
end

--#include calendar_heal

--#include window_settle reset=reset
