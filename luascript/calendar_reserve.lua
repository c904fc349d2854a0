-- A reservation on a calendar window (docs/allotments.md), in the period
-- that holds Redis's TIME: as fixed_window_reserve.lua, in that period's
-- hash, which window_return.lua gives back to. See doc.go for the hash
-- layout.
--
-- KEYS     the three periods' hashes around the caller's clock
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {granted, used, remaining, reset_ms, retry_after_ms, valid_ms,
-- healed, period}, as fixed_window_reserve.lua's; valid_ms and reset_ms
-- are until the period ends, and period is which of the three it is
-- (1..3), so that the units go back to its key. Error replies start with
-- INVALID, CLOCK_SKEW or WRONGTYPE.
--
-- No error reply follows a write other than a restored TTL, and the one
-- HSET that applies the reservation is the first write that may grow
-- memory, as in fixed_window_reserve.lua.

--#args
--#include calendar_period
local field = 'a:' .. id

local f = redis.pcall('HMGET', key, 'used', 'policy', field)
if f.err then
  return failed_read('window', f)
end
local pttl = redis.call('PTTL', key)
if pttl == -2 then
--#include allot_grant left=limit
  redis.call('HSET', key, 'used', grant, 'policy', spec, 'ids', '0', field, seq_s .. ':' .. grant)
  redis.call('PEXPIRE', key, ttl)
  return {grant, grant, limit - grant, reset, 0, reset, 0, p}
end

local used = dec(f[1], 0, MAX_LIMIT)
if not used or type(f[2]) ~= 'string' or not string.match(f[2], '^[0-9]+:[a-z]+:') then
  return fail('WRONGTYPE', NOT_OURS .. 'window: a hash with other fields')
end
local healed = 0
if pttl == -1 then
  redis.call('PEXPIRE', key, ttl)
  healed = 1
end

local kind = 'window'
--#include allot_record at=3

if used + cost > limit then
  return {0, used, limit > used and limit - used or 0, reset, reset, 0, healed, p}
end
--#include allot_grant left=(limit-used)
used = used + grant
local total = math.min(kept, held) + grant
redis.call('HSET', key, 'used', used, 'policy', spec, field, seq_s .. ':' .. total)
if f[2] ~= spec and healed == 0 then
  -- A named policy whose period or zone changed: the window ends with the
  -- period it now counts, as a take's does.
  redis.call('PEXPIRE', key, ttl)
end
return {grant, used, limit - used, reset, 0, reset, healed, p}
