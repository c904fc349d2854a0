-- Gives back the unused units of a reservation (docs/allotments.md) to
-- the fixed window or calendar period it was taken in: KEYS[1] is that
-- window's hash (a calendar period's own key), never a later one's. See
-- doc.go for the hash layout.
--
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {returned, used}, integers only, as every return's (ParseReturn):
-- returned is the units given back, 0 when nothing was applied: the
-- window ended (its key is gone: the units need no return), the holder's
-- record names a later reservation, or this return was applied before (it
-- removed the record), so a return retried after a lost reply applies
-- once. Error replies start with INVALID (more units than the holder
-- reserved in the window) or WRONGTYPE.
--
-- Every check precedes the one HSET and HDEL, and a key without a TTL is
-- left as it is (its next take restores the TTL): a return never creates
-- a key nor gives one a TTL it lacks. Under maxmemory (noeviction) the
-- HSET rewrites a field of the same length or shorter and HDEL frees
-- memory; Redis may refuse the HSET, before anything was written.

--#args
local field = 'a:' .. id

local f = redis.pcall('HMGET', key, 'used', field)
if f.err then
  return failed_read('window', f)
end
if not f[2] then
  return {0, dec(f[1], 0, MAX_LIMIT) or 0}
end
local used = dec(f[1], 0, MAX_LIMIT)
if not used then
  return fail('WRONGTYPE', NOT_OURS .. 'window: a hash with other fields')
end
local healed, kind = 0, 'window'
--#include allot_record at=2
if string.match(f[2], '^(%d+):') ~= seq_s then
  return {0, used}
end
if cost > held then
  return fail('INVALID', 'return of ' .. cost_s .. ' units: the reservation holds ' .. held)
end
if redis.call('PTTL', key) < 0 then
  return {0, used}
end
used = math.max(used - cost, 0)
redis.call('HSET', key, 'used', used)
redis.call('HDEL', key, field)
return {cost, used}
