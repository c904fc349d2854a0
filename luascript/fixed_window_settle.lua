-- Settles an accepted take of one fixed window: the take reserved the cost
-- its record holds, and the work it paid for cost this much. See doc.go for
-- the hash layout.
--
-- KEYS[1]  window hash
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {settled, replay, reserved, used, remaining, reset_ms,
-- retry_after_ms, healed}, integers only, as every settle's (ParseSettle). settled 0: the window holds no take of that request id
-- (the window ended, or the id was never accepted in it), nothing changed,
-- and used and reset_ms are the window's as they are. replay 1: this
-- request id was settled before with this cost, nothing changed. Otherwise
-- used moves by cost - reserved and s:<id> records the cost. retry_after_ms
-- is what a take of 1 would be told now. Error replies start with INVALID,
-- CONFLICT (settled before with another cost), POLICY or WRONGTYPE.
--
-- A settle is never limited: used may end above the limit (takes then wait
-- for the window's end), and saturates at MAX_LIMIT, the bound every script
-- reads used with. It never creates a window and never moves its end: the
-- only PEXPIRE is the one that heals a window without TTL.
--
-- No error reply follows a write other than a restored TTL. Every argument
-- is checked before Redis is touched, and the WRONGTYPE checks of the read
-- come before any write. The first write of a path is either the PEXPIRE
-- that heals a window without TTL, after which the replies may be POLICY,
-- WRONGTYPE (a malformed record or settlement) or CONFLICT, each marked
-- TTL_RESTORED; or the one HSET that applies the settlement (used and
-- s:<id> together), after which only the reply follows.
--
-- Under maxmemory (noeviction) Redis refuses the HSET, the only write that
-- may grow memory, before anything else is written: a full Redis leaves
-- the window as it was (but for a restored TTL) or settles in full.
--
-- Records are read as "<cost>:<used>" followed by nothing or by ':' and
-- fields this script does not know, which it leaves as they are; it never
-- rewrites a take's record.

--#args
local policy = limit_s .. ':' .. window_s

--#include window_read fields='r:'..id,'s:'..id
if pttl == -2 then
  return {0, 0, 0, 0, limit, 0, 0, 0}
end

local used = dec(f[1], 0, MAX_LIMIT)
if not used or f[2] ~= policy and (type(f[2]) ~= 'string' or not string.find(f[2], '^%d+:%d+$')) then
  return fail('WRONGTYPE', NOT_OURS .. 'window: a hash with other fields')
end

--#include window_heal

--#include window_settle reset=pttl
