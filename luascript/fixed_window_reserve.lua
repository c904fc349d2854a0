-- A reservation on one fixed window (docs/allotments.md): one atomic take
-- of between cost and want units for a sidecar to hand out from memory,
-- recorded under its holder so that what it gives back later is applied
-- once (window_return.lua). See doc.go for the hash layout.
--
-- KEYS[1]  window hash
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {granted, used, remaining, reset_ms, retry_after_ms, valid_ms,
-- healed, period}, integers only, as every reservation's (ParseReserve):
-- granted 0 is a denial of the take's cost, told to retry when the window
-- ends; otherwise cost <= granted <= want units were consumed, and may be
-- handed out for valid_ms (until the window ends). period is 0. Error
-- replies start with INVALID or WRONGTYPE.
--
-- No error reply follows a write other than a restored TTL: every
-- argument is checked before Redis is touched, the WRONGTYPE checks of the
-- read come before any write, and the one HSET that applies the
-- reservation comes last but for the PEXPIRE of a new window. Under
-- maxmemory (noeviction) Redis refuses that HSET, the only write that may
-- grow memory, before anything is written: a full Redis reserves nothing.
-- A named policy's new limits apply at once, as a take's do.

--#args
local policy = limit_s .. ':' .. window_s
local field = 'a:' .. id

local f = redis.pcall('HMGET', key, 'used', 'policy', field)
if f.err then
  return failed_read('window', f)
end
local pttl = redis.call('PTTL', key)
if pttl == -2 then
--#include allot_grant left=limit
  redis.call('HSET', key, 'used', grant, 'policy', policy, 'ids', '0', field, seq_s .. ':' .. grant)
  redis.call('PEXPIRE', key, window)
  return {grant, grant, limit - grant, window, 0, window, 0, 0}
end

local used = dec(f[1], 0, MAX_LIMIT)
if not used or f[2] ~= policy and (type(f[2]) ~= 'string' or not string.find(f[2], '^%d+:%d+$')) then
  return fail('WRONGTYPE', NOT_OURS .. 'window: a hash with other fields')
end
-- A window without a TTL would hold its quota forever: it gets its own
-- length again, as a take's window_heal gives it.
local healed = 0
if pttl == -1 then
  local own = dec(string.match(f[2], ':(%d+)$'), 1, MAX_WINDOW_MS) or window
  redis.call('PEXPIRE', key, own)
  pttl, healed = own, 1
end

local kind = 'window'
--#include allot_record at=3

if used + cost > limit then
  return {0, used, limit > used and limit - used or 0, pttl, pttl, 0, healed, 0}
end
--#include allot_grant left=(limit-used)
used = used + grant
local total = math.min(kept, held) + grant
if f[2] == policy then
  redis.call('HSET', key, 'used', used, field, seq_s .. ':' .. total)
else
  redis.call('HSET', key, 'used', used, 'policy', policy, field, seq_s .. ':' .. total)
end
return {grant, used, limit - used, pttl, 0, pttl, healed, 0}
