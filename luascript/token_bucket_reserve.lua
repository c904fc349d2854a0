-- A reservation on one token bucket (docs/allotments.md): a take of
-- between cost and want tokens at this instant, as token_bucket_take.lua
-- decides one (GCRA: the TAT moves on by their span), recorded under its
-- holder so that what it gives back later is applied once
-- (token_bucket_return.lua). See doc.go for the hash layout.
--
-- KEYS[1]  bucket hash
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {granted, used, remaining, reset_ms, retry_after_ms, valid_ms,
-- healed, period}, as every reservation's (ParseReserve): granted 0 is a
-- denial of the take's cost, told when cost tokens are in the bucket;
-- valid_ms is until the bucket would be full again after the
-- reservation, as long as its tokens may be handed out. period is 0.
-- Error replies start with INVALID or WRONGTYPE.
--
-- No error reply follows a write other than a restored TTL, and the one
-- HSET that applies the reservation is the first write that may grow
-- memory; only its PEXPIRE follows.

--#args
local policy = rate_s .. ':' .. period_s .. ':' .. burst_s
local field = 'a:' .. id

local now = redis_now()
local g = gcra(rate, period, burst, now)

local f = redis.pcall('HMGET', key, 'tat', 'rem', 'policy', 'ids', field)
if f.err then
  return failed_read('token bucket', f)
end
local pttl = redis.call('PTTL', key)

local tat, rem, ids = now, 0, 0
local stored = f[3]
if pttl ~= -2 then
  tat = dec(f[1], 0, MAX_EXACT)
  rem = dec(f[2], 0, MAX_LIMIT)
  ids = dec(f[4] or '0', 0, MAX_REQUEST_IDS)
  if not (tat and rem and ids) or stored ~= policy
      and (type(stored) ~= 'string' or not string.find(stored, '^%d+:%d+:%d+$')) then
    return fail('WRONGTYPE', NOT_OURS .. 'token bucket: a hash with other fields')
  end
end
tat, rem = g.rebase(tat, rem, pttl == -2 or stored == policy)

--#include bucket_heal

local kind = 'token bucket'
--#include allot_record at=5

-- The take's own test: accepted iff TAT + span(cost) - tau <= now.
local new_u, new_r = g.add(tat, rem, g.span(cost))
local at_u, at_r = g.sub(new_u, new_r, g.tau_u, g.tau_r)
if not g.le(at_u, at_r, now, 0) then
  local tokens = g.tokens(tat, rem)
  return {0, burst - tokens, tokens, g.ms_until(tat, rem), g.ms_until(at_u, at_r), 0, healed, 0}
end
-- The whole tokens in the bucket: at least cost, since cost fits.
local left = math.max(g.tokens(tat, rem), cost)
--#include allot_grant left=left
new_u, new_r = g.add(tat, rem, g.span(grant))
local remaining = g.tokens(new_u, new_r)
local reset = g.ms_until(new_u, new_r)
local total = math.min(kept, held) + grant
if stored == policy then
  redis.call('HSET', key, 'tat', new_u, 'rem', new_r, field, seq_s .. ':' .. total)
else
  redis.call('HSET', key, 'tat', new_u, 'rem', new_r, 'policy', policy, field, seq_s .. ':' .. total)
end
-- The key lives until the bucket is full again, never shorter than it
-- did (a request id's record may need longer).
redis.call('PEXPIRE', key, math.max(reset, pttl, 1))
return {grant, burst - remaining, remaining, reset, 0, reset, healed, 0}
