-- Acquires or renews one concurrency lease. See doc.go for the hash layout.
--
-- KEYS[1]  lease hash
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {allowed, replay, used, remaining, reset_ms, retry_after_ms,
-- healed}, integers only (an allowed take that healed nothing leaves out
-- the last two), as every take's: used counts live leases after the
-- decision, reset_ms is until the last of them expires, retry_after_ms
-- until the first does (when denied). Error replies start with INVALID,
-- POLICY or WRONGTYPE.
--
-- Time is Redis's own (TIME), in milliseconds. Expired leases are reclaimed
-- here, so a holder that died blocks the subject for at most its lease.
--
-- No error reply follows a write other than a restored TTL. Every argument
-- is checked before Redis is touched, and every WRONGTYPE check of the one
-- read comes before any write. The first write is either the PEXPIRE that
-- heals a set without TTL, after which the only error is POLICY, marked
-- TTL_RESTORED; or, past the POLICY check, the HDEL that reclaims expired
-- leases, after which every path answers a decision.

--#args
local policy = limit_s .. ':' .. lease_s

local _, now = redis_now()

local own = 'l:' .. id
--#include lease_scan
local healed = 0
if #all > 0 then
  -- A key that HGETALL found empty does not exist: it has no TTL to lose.
  if redis.call('PTTL', key) == -1 then
    -- Lost its TTL: give it back whatever follows, errors included.
    redis.call('PEXPIRE', key, math.max(last - now, (mine or 0) - now, 1))
    healed = 1
  end
end
if strict == '1' and stored and stored ~= policy then
  return fail('POLICY', 'live lease set has limit:lease_ms ' .. stored, healed)
end

-- Reclaim what expired, whatever the decision.
if expired then
  redis.call('HDEL', key, unpack(expired))
end
-- A renewal keeps its slot even when a lowered limit is now full.
if not mine and live >= limit then
  redis.call('PEXPIRE', key, last - now)
  return {0, 0, live, limit > live and limit - live or 0, last - now, first - now, healed}
end
local exp = now + lease
if stored == policy then
  redis.call('HSET', key, own, string.format('%d', exp))
else
  redis.call('HSET', key, own, string.format('%d', exp), 'policy', policy)
end
if exp > last then
  last = exp
end
redis.call('PEXPIRE', key, last - now)
local replay = 0
if mine then
  replay = 1
end
if healed == 0 then
  return {1, replay, live + 1, limit > live + 1 and limit - live - 1 or 0, last - now}
end
return {1, replay, live + 1, limit > live + 1 and limit - live - 1 or 0, last - now, 0, healed}
