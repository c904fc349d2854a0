-- Settles an accepted take of one token bucket (GCRA): the take reserved
-- the cost its record holds, and the work it paid for cost this much. See
-- doc.go for the hash layout.
--
-- KEYS[1]  bucket hash
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {settled, replay, reserved, used, remaining, reset_ms,
-- retry_after_ms, healed}, integers only, as every settle's; used,
-- remaining, reset_ms and retry_after_ms (for a take of 1) are the
-- bucket's as a take would report them. settled 0: the
-- bucket holds no record of that request id (its dedupe horizon passed, or
-- it was never accepted), and nothing changed. replay 1: settled before
-- with this cost, nothing changed. Error replies start with INVALID,
-- CONFLICT (settled before with another cost), POLICY or WRONGTYPE.
--
-- The TAT moves by the span of cost - reserved tokens: back, never below
-- now (a TAT at now is a full bucket; an earlier one would hold more than
-- the burst, which the take's rebase forgets anyway); or on, even past the
-- burst's span (later takes wait), but never more than MAX_WINDOW_MS past
-- now, the bound every time a bucket stores keeps, so the arithmetic stays
-- exact and the key's TTL bounded. Time is Redis's own (TIME), in whole
-- microseconds; the arithmetic is the prelude's gcra.
--
-- A settlement is s:<id> = "<cost>:<expiry of the record it settles>", so
-- one left by an earlier take of the same id (whose record expired and was
-- overwritten) is told apart and replaced. They are queued as the records
-- are: sh, st and sq:<n> = "<id>:<expiry ms>", and every settle forgets up
-- to three settlements past their expiry, oldest first, so they stay
-- bounded. The record is kept: it stays for its dedupe horizon, so a
-- retried take is still a replay and a retried settle still one too.
--
-- The key lives until the bucket is full again and as long as its newest
-- record, as the take keeps it: a TAT moved on lengthens its TTL, never
-- shortens it.
--
-- No error reply follows a write other than a restored TTL. Every argument
-- is checked before Redis is touched, and the WRONGTYPE checks of the
-- reads come before any write. The first write of a path is either the
-- PEXPIRE that heals a bucket without TTL, after which the replies may be
-- POLICY, WRONGTYPE (a malformed record or settlement) or CONFLICT, each
-- marked TTL_RESTORED; or the one HSET that applies the settlement, after
-- which only the HDEL of the settlements planned (with reads only) to be
-- forgotten and the PEXPIRE follow.
--
-- Under maxmemory (noeviction) Redis refuses the HSET, the first write
-- that may grow memory, before anything else is written: a full Redis
-- leaves a bucket as it was (but for a restored TTL) or settles in full.
--
-- Records are read as "<cost>:<remaining>:<expiry>" followed by nothing or
-- by ':' and fields this script does not know, which it leaves as they
-- are; it never rewrites a take's record.

--#args
local policy = rate_s .. ':' .. period_s .. ':' .. burst_s

local now, now_ms = redis_now()
local g = gcra(rate, period, burst, now)

local f = redis.pcall('HMGET', key, 'tat', 'rem', 'policy', 'ids', 'r:' .. id, 's:' .. id, 'sh', 'st')
if f.err then
  return failed_read('token bucket', f)
end
local pttl = redis.call('PTTL', key)
if pttl == -2 then
  return {0, 0, 0, 0, burst, 0, 0, 0}
end

local stored = f[3]
local tat = dec(f[1], 0, MAX_EXACT)
local rem = dec(f[2], 0, MAX_LIMIT)
local ids = dec(f[4] or '0', 0, MAX_REQUEST_IDS)
local sh = dec(f[7] or '0', 0, MAX_EXACT)
local st = dec(f[8] or '0', 0, MAX_EXACT)
if not (tat and rem and ids and sh and st and sh <= st) or stored ~= policy
    and (type(stored) ~= 'string' or not string.find(stored, '^%d+:%d+:%d+$')) then
  return fail('WRONGTYPE', NOT_OURS .. 'token bucket: a hash with other fields')
end
tat, rem = g.rebase(tat, rem, stored == policy)

--#include bucket_heal

if strict == '1' and stored ~= policy then
  return fail('POLICY', 'live bucket has rate:period_ms:burst ' .. stored, healed)
end

-- The reply's view of the bucket when its TAT is (u, r).
local function view(settled, replay, reserved, u, r)
  local at_u, at_r = g.sub(u, r, g.tau_u, g.tau_r)
  at_u, at_r = g.add(at_u, at_r, g.span(1))
  local tokens = g.tokens(u, r)
  return {settled, replay, reserved, burst - tokens, tokens, g.ms_until(u, r), g.ms_until(at_u, at_r), healed}
end

if not f[5] then
  return view(0, 0, 0, tat, rem)
end
local rc, rr, rx, rest = string.match(f[5], '^(%d+):(%d+):(%d+)(.*)$')
local reserved = dec(rc, 1, MAX_LIMIT)
local rxn = dec(rx, 0, MAX_EXACT)
if not reserved or not rxn or not dec(rr, 0, MAX_LIMIT) or rest ~= '' and string.sub(rest, 1, 1) ~= ':' then
  return fail('WRONGTYPE', NOT_OURS .. 'token bucket: malformed request id record', healed)
end
if rxn <= now_ms then
  -- Past its dedupe horizon: the bucket has forgotten the take.
  return view(0, 0, 0, tat, rem)
end

if f[6] then
  local sc, sx, srest = string.match(f[6], '^(%d+):(%d+)(.*)$')
  if not dec(sc, 0, MAX_LIMIT) or not dec(sx, 0, MAX_EXACT) or srest ~= '' and string.sub(srest, 1, 1) ~= ':' then
    return fail('WRONGTYPE', NOT_OURS .. 'token bucket: malformed settlement', healed)
  end
  if sx == rx then
    if sc ~= cost_s then
      return fail('CONFLICT', 'request id was settled with cost ' .. sc, healed)
    end
    return view(1, 1, reserved, tat, rem)
  end
end

-- The TAT moved by the difference, within now .. now + MAX_WINDOW_MS.
local far = now + MAX_WINDOW_MS * 1000
local u, r = tat, rem
if cost > reserved then
  local extra = cost - reserved
  -- Beyond the bound, span would not be exact: the product is compared
  -- first (in floating point, as the burst's bound is).
  if extra * period > MAX_WINDOW_MS * rate then
    u, r = far, 0
  else
    u, r = g.add(u, r, g.span(extra))
  end
  if u >= far then
    u, r = far, 0
  end
elseif cost < reserved then
  u, r = g.sub(u, r, g.span(reserved - cost))
  if u < now then
    u, r = now, 0
  end
end

--#include prune q=sq r=s head=sh tail=st now=now_ms expiry=^%d+:(%d+)

local fields = {'tat', string.format('%d', u), 'rem', string.format('%d', r),
  's:' .. id, cost_s .. ':' .. rx, 'sq:' .. string.format('%d', st), id .. ':' .. rx,
  'sh', string.format('%d', sh + popped), 'st', string.format('%d', st + 1)}
if stored ~= policy then
  -- rem is now in this rate's units.
  fields[#fields + 1] = 'policy'
  fields[#fields + 1] = policy
end
redis.call('HSET', key, unpack(fields))
if drop and #drop > 0 then
  redis.call('HDEL', key, unpack(drop))
end
local ttl = g.ms_until(u, r)
if ttl > pttl then
  redis.call('PEXPIRE', key, ttl)
end
return view(1, 0, reserved, u, r)
