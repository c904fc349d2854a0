-- Gives back the unused tokens of a reservation (docs/allotments.md) to
-- the token bucket it was taken from: the TAT moves back by their span,
-- never before now (a full bucket stays full: tokens beyond the burst
-- never accrue). See doc.go for the hash layout.
--
-- KEYS[1]  bucket hash
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {returned, used}, as every return's (ParseReturn): returned 0
-- when nothing was applied: the bucket is gone (it was full: nothing to
-- give back to), the holder's record names a later reservation or was
-- removed by this return before, or the bucket's shape changed since (the
-- tokens' span is another). Error replies start with INVALID (more tokens
-- than the holder reserved) or WRONGTYPE.
--
-- Every check precedes the one HSET and HDEL; a key without a TTL is left
-- as it is, and the TTL is never changed: the bucket is full again no
-- later than before the return.

--#args
local policy = rate_s .. ':' .. period_s .. ':' .. burst_s
local field = 'a:' .. id

local f = redis.pcall('HMGET', key, 'tat', 'rem', 'policy', field)
if f.err then
  return failed_read('token bucket', f)
end
if not f[4] then
  return {0, 0}
end
local tat, rem = dec(f[1], 0, MAX_EXACT), dec(f[2], 0, MAX_LIMIT)
if not (tat and rem) or type(f[3]) ~= 'string' or not string.find(f[3], '^%d+:%d+:%d+$') then
  return fail('WRONGTYPE', NOT_OURS .. 'token bucket: a hash with other fields')
end
local healed, kind = 0, 'token bucket'
--#include allot_record at=4
if string.match(f[4], '^(%d+):') ~= seq_s or f[3] ~= policy then
  return {0, 0}
end
if cost > held then
  return fail('INVALID', 'return of ' .. cost_s .. ' tokens: the reservation holds ' .. held)
end
if redis.call('PTTL', key) < 0 then
  return {0, 0}
end
local now = redis_now()
local g = gcra(rate, period, burst, now)
tat, rem = g.rebase(tat, rem, true)
local su, sr = g.span(cost)
local u, r = g.sub(tat, rem, su, sr)
if not g.le(now, 0, u, r) then
  u, r = now, 0
end
redis.call('HSET', key, 'tat', u, 'rem', r)
redis.call('HDEL', key, field)
return {cost, burst - g.tokens(u, r)}
