#!lua flags=no-writes
-- Reads one lease set without writing anything; expired leases are not
-- counted (the next take or release reclaims them). The flags line lets
-- Redis run it on a replica; see scripts.go.
--
-- KEYS[1]  lease hash
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {exists, used, remaining, reset_ms}, integers only, as every
-- peek's: used is live leases, and reset_ms until the last of them expires
-- (0 when none is held).
--
-- It never writes, so no error reply follows a write; Redis refuses any
-- write it tried (no-writes).

--#args
local policy = limit_s .. ':' .. lease_s
local _, now = redis_now()

local own = nil
--#include lease_scan
if strict == '1' and stored and stored ~= policy then
  return fail('POLICY', 'live lease set has limit:lease_ms ' .. stored)
end
local exists = 0
if stored then
  exists = 1
end
if live == 0 then
  return {exists, 0, limit, 0}
end
return {exists, live, limit > live and limit - live or 0, last - now}
