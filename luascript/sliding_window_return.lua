-- Gives back the unused units of a reservation (docs/allotments.md) to
-- the period of the sliding window they counted in: its count falls by
-- them while that period is the window's current or previous one; after,
-- they count in no estimate and nothing is applied. See doc.go for the
-- hash layout.
--
-- KEYS[1]  sliding window hash
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {returned, used}, as every return's (ParseReturn); used is the
-- current period's count as stored. returned 0 when nothing was applied:
-- the window is gone, its period no longer counts, the holder's record
-- names a later reservation or was removed by this return before. Error
-- replies start with INVALID (more units than the holder reserved) or
-- WRONGTYPE.
--
-- Every check precedes the one HSET and HDEL; a key without a TTL is left
-- as it is, and the TTL is never changed.

--#args
local field = 'a:' .. id

local f = redis.pcall('HMGET', key, 's', 'c', 'p', 'policy', field)
if f.err then
  return failed_read('sliding window', f)
end
if not f[5] then
  return {0, 0}
end
local s, c, p = dec(f[1], 0, MAX_EXACT), dec(f[2], 0, MAX_LIMIT), dec(f[3], 0, MAX_LIMIT)
local stored = type(f[4]) == 'string' and dec(string.match(f[4], '^%d+:(%d+)$'), 1, MAX_WINDOW_MS)
if not (s and c and p and stored) then
  return fail('WRONGTYPE', NOT_OURS .. 'sliding window: a hash with other fields')
end
local healed, kind = 0, 'sliding window'
--#include allot_record at=5
local ps = dec(string.sub(tail, 2), 0, MAX_EXACT)
if not ps then
  return fail('WRONGTYPE', NOT_OURS .. 'sliding window: malformed reservation record')
end
if string.match(f[5], '^(%d+):') ~= seq_s then
  return {0, c}
end
if cost > held then
  return fail('INVALID', 'return of ' .. cost_s .. ' units: the reservation holds ' .. held)
end
if redis.call('PTTL', key) < 0 then
  return {0, c}
end
if ps == s then
  c = math.max(c - cost, 0)
  redis.call('HSET', key, 'c', c)
elseif ps == s - stored then
  redis.call('HSET', key, 'p', math.max(p - cost, 0))
else
  redis.call('HDEL', key, field)
  return {0, c}
end
redis.call('HDEL', key, field)
return {cost, c}
