-- One quota decision on one fixed window. See doc.go for the hash layout.
--
-- KEYS[1]  window hash
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {allowed, replay, used, remaining, pttl_ms, retry_after_ms,
-- healed}, integers only (an allowed take that healed nothing leaves out
-- the last two), as every take's (ParseTake); a denial is told to retry
-- when the window ends. Error replies start with INVALID, CONFLICT, POLICY,
-- WRONGTYPE or REQUEST_IDS_FULL.
--
-- Redis calls per decision: one HMGET, one PTTL, at most one HSET, and a
-- PEXPIRE only when the window is created or has lost its TTL.
--
-- No error reply follows a write other than a restored TTL. Every argument
-- is checked before Redis is touched, and the WRONGTYPE checks of the read
-- come before any write. The first write of a path is either the PEXPIRE
-- that heals a window without TTL, after which the replies may be POLICY,
-- WRONGTYPE (a malformed record), CONFLICT or REQUEST_IDS_FULL, each marked
-- TTL_RESTORED; or the HSET that applies an accepted take, after which only
-- the PEXPIRE of a new window and the decision follow. REQUEST_IDS_FULL is
-- decided before that HSET.
--
-- Under maxmemory (noeviction) Redis refuses only a script's first write
-- that may grow memory (HSET), and allows every write after one succeeded.
-- Each path's first write is its HSET, or a PEXPIRE (never refused) that
-- restores a TTL, so a full Redis leaves a window untouched or decides in
-- full: nothing is ever half-written. Keep that order when changing a path.

--#args
local policy = limit_s .. ':' .. window_s

--#include window_read fields='ids','r:'..id
--#include window_open policy=policy ttl=window_s reset=window

local used = dec(f[1], 0, MAX_LIMIT)
-- ids absent counts as 0 so a window written without it stays usable.
local ids = dec(f[3] or '0', 0, MAX_REQUEST_IDS)
-- The stored policy is well formed when it is this call's (the usual case).
if not used or not ids or f[2] ~= policy and (type(f[2]) ~= 'string' or not string.find(f[2], '^%d+:%d+$')) then
  return fail('WRONGTYPE', NOT_OURS .. 'window: a hash with other fields')
end

--#include window_heal

--#include window_replay reset=pttl

if id ~= '' and ids >= maxids then
  return fail('REQUEST_IDS_FULL', 'window holds ' .. ids .. ' request ids', healed)
end

-- Sums stay below 2^31, which tostring's 14 significant digits print
-- exactly. The policy is written only when it changed.
used = used + cost
if id == '' then
  if f[2] == policy then
    redis.call('HSET', key, 'used', used)
  else
    redis.call('HSET', key, 'used', used, 'policy', policy)
  end
elseif f[2] == policy then
  redis.call('HSET', key, 'used', used, 'ids', ids + 1, 'r:' .. id, cost_s .. ':' .. used)
else
  redis.call('HSET', key, 'used', used, 'policy', policy, 'ids', ids + 1, 'r:' .. id, cost_s .. ':' .. used)
end
if healed == 0 then
  return {1, 0, used, limit - used, pttl}
end
return {1, 0, used, limit - used, pttl, 0, healed}
