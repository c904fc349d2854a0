-- Frees one concurrency lease. See doc.go for the hash layout.
--
-- KEYS[1]  lease hash
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {released, used}, integers only: released is 1 when a live lease of
-- that name was freed, 0 when there was none (expired, released before, or
-- never taken); used counts the live leases left. Expired leases are
-- reclaimed; a set left with no lease is deleted, else its TTL is that of
-- its last lease.
--
-- No error reply follows a write. Every argument is checked before Redis
-- is touched, and every WRONGTYPE check of the one read comes before the
-- first write (DEL, or HDEL then PEXPIRE), after which only the decision
-- is answered.

--#args

local _, now = redis_now()

local policy, own = nil, 'l:' .. id
--#include lease_scan
if #all == 0 then
  return {0, 0}
end
local released, gone = 0, expired
if mine then
  released, gone = 1, gone or {}
  gone[#gone + 1] = own
end
if live == 0 then
  redis.call('DEL', key)
  return {released, 0}
end
if gone then
  redis.call('HDEL', key, unpack(gone))
end
redis.call('PEXPIRE', key, last - now)
return {released, live}
