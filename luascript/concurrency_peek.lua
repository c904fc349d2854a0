#!lua flags=no-writes
-- Reads one lease set without writing anything; expired leases are not
-- counted (the next take or release reclaims them). The flags line lets
-- Redis run it on a replica; see scripts.go.
--
-- KEYS[1]  lease hash
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {used, reset_ms}, integers only: live leases, and milliseconds until
-- the last of them expires (0 when none is held).
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
if live == 0 then
  return {0, 0}
end
return {live, last - now}
