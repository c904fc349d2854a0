-- One quota decision on one calendar window. See doc.go for the layout.
--
-- KEYS[1..3]  the window hashes of three consecutive periods: the one
--             holding the sidecar's clock, the one before and the one after
-- ARGV        its contract's (contract.go), listed where --#args is
--             spliced in: limit, cost, max_ids, strict, request_id, the
--             spec "<limit>:<period>:<zone>:<week_start>:<jitter_ms>"
--             (a period counted from the Unix epoch is "epoch<seconds>"),
--             and the 4 edges, ms of Redis's clock, increasing: KEYS[i]
--             counts the period from edge i to edge i + 1
--
-- The sidecar knows the time zone; Redis knows the time. The sidecar
-- computes the periods around its own clock (in Go, with its zone
-- database) and this script picks the one holding Redis's TIME, so every
-- sidecar counts the same instant in the same period whatever its own
-- clock says, as long as that clock is within a period of Redis's. When
-- it is not, the reply is CLOCK_SKEW and nothing is written.
--
-- Reply {allowed, replay, used, remaining, reset_ms, retry_after_ms,
-- healed}, integers only (an allowed take that healed nothing leaves out
-- the last two), as every take's; reset_ms is until the period's end, and
-- so is a denial's retry_after_ms. Error replies start with INVALID,
-- CONFLICT, POLICY, WRONGTYPE, REQUEST_IDS_FULL or CLOCK_SKEW.
--
-- The key lives until its period's end plus MARGIN_MS, so no window
-- outlives its period by more than that; a later take never reads it,
-- since it names the next period's key. Its TTL is set with PEXPIRE, the
-- time from Redis's now to then, not PEXPIREAT, so the ACL user the README
-- documents needs no command the other scripts do not.
--
-- No error reply follows a write other than a restored TTL: every argument
-- is checked and the period chosen before Redis is touched, and the paths
-- are those of fixed_window_take.lua (HSET first, then the PEXPIRE of a
-- new window), so a full Redis (maxmemory) leaves a window untouched or
-- decides in full.

--#args
--#include calendar_period

--#include window_read fields='ids','r:'..id
--#include window_open policy=spec ttl=ttl reset=reset

local used = dec(f[1], 0, MAX_LIMIT)
local ids = dec(f[3] or '0', 0, MAX_REQUEST_IDS)
if not used or not ids or type(f[2]) ~= 'string' or not string.match(f[2], '^[0-9]+:[a-z0-9]+:') then
  return fail('WRONGTYPE', NOT_OURS .. 'window: a hash with other fields')
end

--#include calendar_heal

--#include window_replay reset=reset

used = used + cost
if id == '' then
  redis.call('HSET', key, 'used', used, 'policy', spec)
else
  if ids >= maxids then
    return fail('REQUEST_IDS_FULL', 'window holds ' .. ids .. ' request ids', healed)
  end
  redis.call('HSET', key, 'used', used, 'policy', spec, 'ids', ids + 1, 'r:' .. id, cost_s .. ':' .. used)
end
if f[2] ~= spec and healed == 0 then
  -- A named policy whose period or zone changed: the window ends with the
  -- period it now counts.
  redis.call('PEXPIRE', key, ttl)
end
if healed == 0 then
  return {1, 0, used, limit - used, reset}
end
return {1, 0, used, limit - used, reset, 0, healed}
