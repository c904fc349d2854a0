#!lua flags=no-writes
-- Reads one token bucket without writing anything, not even a missing TTL.
-- The flags line lets Redis run it on a replica; see scripts.go.
--
-- KEYS[1]  bucket hash
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {exists, used, remaining, reset_ms}, integers only, as every
-- peek's: remaining is whole tokens in the bucket now, used the burst less
-- them, and reset_ms until it is full (0 when it is, or there is no
-- bucket).
-- The arithmetic is the prelude's gcra, as for token_bucket_take.lua.
--
-- It never writes, so no error reply follows a write; Redis refuses any
-- write it tried (no-writes).

--#args
local policy = rate_s .. ':' .. period_s .. ':' .. burst_s

local now = redis_now()

local f = redis.pcall('HMGET', key, 'tat', 'rem', 'policy')
if f.err then
  return failed_read('token bucket', f)
end
if redis.call('EXISTS', key) == 0 then
  return {0, 0, burst, 0}
end
local tat = dec(f[1], 0, MAX_EXACT)
local rem = dec(f[2], 0, MAX_LIMIT)
-- The stored policy is well formed when it is this call's (the usual case).
if not tat or not rem or f[3] ~= policy and (type(f[3]) ~= 'string' or not string.find(f[3], '^%d+:%d+:%d+$')) then
  return fail('WRONGTYPE', NOT_OURS .. 'token bucket: a hash with other fields')
end
if strict == '1' and f[3] ~= policy then
  return fail('POLICY', 'live bucket has rate:period_ms:burst ' .. f[3])
end
local g = gcra(rate, period, burst, now)
tat, rem = g.rebase(tat, rem, f[3] == policy)
local tokens = g.tokens(tat, rem)
return {1, burst - tokens, tokens, g.ms_until(tat, rem)}
