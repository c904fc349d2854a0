-- Settles an accepted take of one sliding window: the take reserved the
-- cost its record holds, and the work it paid for cost this much. See
-- doc.go for the hash layout, and the prelude's sliding_window for the
-- arithmetic.
--
-- KEYS[1]  window hash
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {settled, replay, reserved, used, remaining, reset_ms,
-- retry_after_ms, healed}, integers only, as every settle's; used, reset_ms and retry_after_ms (for a take of 1) are
-- the window's as a take would report them. settled 0: the window holds
-- no take of that request id that still counts (it slid out: its record
-- expires when it stops counting, at the end of the period after its own;
-- or it was never accepted), and nothing changed. replay 1: settled before
-- with this cost, nothing changed. Error replies start with INVALID,
-- CONFLICT (settled before with another cost), POLICY or WRONGTYPE.
--
-- The take counted in the period its record's expiry names (expiry - 2 *
-- window_ms): the current period's count c or the previous one's p moves
-- by cost - reserved, within 0..MAX_LIMIT, the bounds every script reads
-- them with. The counts are rolled to now first, as a take does, under the
-- window they were written with, whose policy field stays as it is. A
-- settle is never limited: the estimate may end above the limit.
--
-- A settlement is s:<id> = "<cost>:<expiry of the record it settles>", so
-- one left by an earlier take of the same id (whose record expired and was
-- overwritten) is told apart and replaced. They are queued as the records
-- are: sh, st and sq:<n> = "<id>:<expiry ms>", and every settle forgets up
-- to three settlements past their expiry, oldest first, so they stay
-- bounded. Neither a settlement nor its queue outlives the key: a record
-- expires with the key written by its take.
--
-- It never creates a window and never moves its end: the counts it moves
-- are those of periods the key's TTL already covers, and the only PEXPIRE
-- heals a window without TTL, as the take does.
--
-- No error reply follows a write other than a restored TTL. Every argument
-- is checked before Redis is touched, and the WRONGTYPE checks of the
-- reads come before any write. The first write of a path is either the
-- PEXPIRE that heals a window without TTL, after which the replies may be
-- POLICY, WRONGTYPE (a malformed record or settlement) or CONFLICT, each
-- marked TTL_RESTORED; or the one HSET that applies the settlement.
-- Forgetting old settlements is planned with reads only, and its HDEL
-- follows the HSET.
--
-- Under maxmemory (noeviction) Redis refuses the HSET, the first write
-- that may grow memory, before anything else is written: a full Redis
-- leaves a window as it was (but for a restored TTL) or settles in full.
--
-- Records are read as "<cost>:<used>:<expiry>" followed by nothing or by
-- ':' and fields this script does not know, which it leaves as they are;
-- it never rewrites a take's record.

--#args
local policy = limit_s .. ':' .. window_s

local _, now = redis_now()

local f = redis.pcall('HMGET', key, 's', 'c', 'p', 'policy', 'r:' .. id, 's:' .. id, 'sh', 'st')
if f.err then
  return failed_read('sliding window', f)
end
local pttl = redis.call('PTTL', key)
if pttl == -2 then
  return {0, 0, 0, 0, limit, 0, 0, 0}
end

local stored_policy = f[4]
local s = dec(f[1], 0, MAX_EXACT)
local c = dec(f[2], 0, MAX_LIMIT)
local p = dec(f[3], 0, MAX_LIMIT)
local sh = dec(f[7] or '0', 0, MAX_EXACT)
local st = dec(f[8] or '0', 0, MAX_EXACT)
local stored = stored_policy and dec(string.match(stored_policy, '^%d+:(%d+)$'), 1, MAX_WINDOW_MS)
if not (s and c and p and sh and st and stored and sh <= st) then
  return fail('WRONGTYPE', NOT_OURS .. 'sliding window: a hash with other fields')
end

local healed = 0
if pttl == -1 then
  local ttl = math.max(s + 2 * stored - now, 1)
  redis.call('PEXPIRE', key, ttl)
  healed = 1
end

if strict == '1' and stored_policy ~= policy then
  return fail('POLICY', 'live window has limit:window_ms ' .. stored_policy, healed)
end

-- The reply's view: the window as a take under the caller's limits sees
-- it, counts (s2, c2, p2) written under the stored window.
local sw = sliding_window(window)
local function view(settled, replay, reserved, s2, c2, p2)
  local prev, cur, start, elapsed = sw.state(now, s2, c2, p2, stored)
  local used = sw.share(prev, elapsed) + cur
  return {settled, replay, reserved, used, limit > used and limit - used or 0, sw.reset(now, prev, cur, start),
    sw.retry(limit, now, prev, cur, start, elapsed, 1), healed}
end

if not f[5] then
  return view(0, 0, 0, s, c, p)
end
local rc, ru, rx, rest = string.match(f[5], '^(%d+):(%d+):(%d+)(.*)$')
local reserved = dec(rc, 1, MAX_LIMIT)
local rxn = dec(rx, 0, MAX_EXACT)
if not reserved or not rxn or not dec(ru, 0, 2 * MAX_LIMIT) or rest ~= '' and string.sub(rest, 1, 1) ~= ':' then
  return fail('WRONGTYPE', NOT_OURS .. 'sliding window: malformed request id record', healed)
end
if rxn <= now then
  -- Slid out: the take no longer counts in any estimate.
  return view(0, 0, 0, s, c, p)
end

if f[6] then
  local sc, sx, srest = string.match(f[6], '^(%d+):(%d+)(.*)$')
  if not dec(sc, 0, MAX_LIMIT) or not dec(sx, 0, MAX_EXACT) or srest ~= '' and string.sub(srest, 1, 1) ~= ':' then
    return fail('WRONGTYPE', NOT_OURS .. 'sliding window: malformed settlement', healed)
  end
  -- A settlement of this record, not of an earlier take of the same id.
  if sx == rx then
    if sc ~= cost_s then
      return fail('CONFLICT', 'request id was settled with cost ' .. sc, healed)
    end
    return view(1, 1, reserved, s, c, p)
  end
end

-- The counts at now under the window they were written with, and the
-- period the take counted in.
local own = sliding_window(stored)
local prev, cur, start = own.state(now, s, c, p, stored)
local taken = rxn - 2 * stored
local delta = cost - reserved
if taken == start then
  cur = math.min(math.max(cur + delta, 0), MAX_LIMIT)
elseif taken == start - stored then
  prev = math.min(math.max(prev + delta, 0), MAX_LIMIT)
else
  -- Counted under another window (a named policy's window changed since):
  -- its period is not one of these.
  return view(0, 0, 0, s, c, p)
end

--#include prune q=sq r=s head=sh tail=st now=now expiry=^%d+:(%d+)

local fields = {'s', string.format('%d', start), 'c', string.format('%d', cur), 'p', string.format('%d', prev),
  's:' .. id, cost_s .. ':' .. rx, 'sq:' .. string.format('%d', st), id .. ':' .. rx,
  'sh', string.format('%d', sh + popped), 'st', string.format('%d', st + 1)}
redis.call('HSET', key, unpack(fields))
if drop and #drop > 0 then
  redis.call('HDEL', key, unpack(drop))
end
return view(1, 0, reserved, start, cur, prev)
