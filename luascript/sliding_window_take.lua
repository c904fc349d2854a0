-- One decision on one sliding window (the two-window counter). See doc.go
-- for the hash layout, and the prelude's sliding_window for the arithmetic.
--
-- KEYS[1]  window hash
-- ARGV     its contract's (contract.go), listed where --#args is spliced in
--
-- Reply {allowed, replay, used, remaining, reset_ms, retry_after_ms,
-- healed}, integers only (an allowed take that healed nothing leaves out
-- the last two), as every take's: used is the estimate right after the
-- decision, rounded up (for a replay, right after the original acceptance);
-- reset_ms is until the whole use has slid out; retry_after_ms, when
-- denied, is until a take of this cost fits. Error replies start with
-- INVALID, CONFLICT, POLICY, WRONGTYPE or REQUEST_IDS_FULL.
--
-- Time is Redis's own (TIME), in whole milliseconds.
--
-- No error reply follows a write other than a restored TTL. Every argument
-- is checked before Redis is touched, and the WRONGTYPE checks of the read
-- come before any write. The first write of a path is either the PEXPIRE
-- that heals a window without TTL, after which the replies may be POLICY,
-- WRONGTYPE (a malformed record), CONFLICT or REQUEST_IDS_FULL, each marked
-- TTL_RESTORED; or the HSET that applies an accepted take. Forgetting old
-- records is planned with reads only, REQUEST_IDS_FULL is decided on that
-- plan, and only then come the HSET (of the fields whose value changes),
-- the HDEL of the plan and, unless the TTL already ends where it should,
-- the PEXPIRE. A denial writes nothing (but a restored TTL), so it
-- consumes nothing.
--
-- Under maxmemory (noeviction) the HSET, the first write that may grow
-- memory, is refused before anything else is written, so a full Redis
-- leaves a window untouched (but for a restored TTL) or decides in full.

--#args
local policy = limit_s .. ':' .. window_s

local _, now = redis_now()

-- Without a request id there is no record to read: the field list leaves
-- it out rather than reading "r:", which no hash holds.
local f
if id == '' then
  f = redis.pcall('HMGET', key, 's', 'c', 'p', 'policy', 'ids', 'qh', 'qt')
else
  f = redis.pcall('HMGET', key, 's', 'c', 'p', 'policy', 'ids', 'qh', 'qt', 'r:' .. id)
end
if f.err then
  return failed_read('sliding window', f)
end
local pttl = redis.call('PTTL', key)

-- ids, qh and qt read as 0 when absent; a new window writes them all.
local s, c, p, stored, ids, qh, qt = 0, 0, 0, window, 0, 0, 0
local stored_policy = f[4]
if pttl ~= -2 then
  -- The usual case, as for the arguments: one match of the counts joined
  -- by ':' (no digit string holds one), none with a leading zero, then
  -- their bounds, which refuse any of more than 16 digits. Anything else
  -- goes through dec one by one; both accept exactly the same fields.
  local f5, f6, f7 = f[5] or '0', f[6] or '0', f[7] or '0'
  local all = f[1] and f[2] and f[3] and ':' .. f[1] .. ':' .. f[2] .. ':' .. f[3] .. ':' .. f5 .. ':' .. f6 .. ':' .. f7
  if all and string.find(all, '^:%d+:%d+:%d+:%d+:%d+:%d+$') and not string.find(all, ':0%d') then
    s, c, p, ids, qh, qt = f[1] + 0, f[2] + 0, f[3] + 0, f5 + 0, f6 + 0, f7 + 0
    if s > MAX_EXACT or c > MAX_LIMIT or p > MAX_LIMIT or ids > MAX_REQUEST_IDS or qh > MAX_EXACT or qt > MAX_EXACT then
      s = nil
    end
  else
    s = nil
  end
  if not s then
    s = dec(f[1], 0, MAX_EXACT)
    c = dec(f[2], 0, MAX_LIMIT)
    p = dec(f[3], 0, MAX_LIMIT)
    ids = dec(f5, 0, MAX_REQUEST_IDS)
    qh = dec(f6, 0, MAX_EXACT)
    qt = dec(f7, 0, MAX_EXACT)
  end
  -- The caller's policy, the usual case, has this caller's window.
  if stored_policy ~= policy then
    stored = stored_policy and dec(string.match(stored_policy, '^%d+:(%d+)$'), 1, MAX_WINDOW_MS)
  end
  if not (s and c and p and ids and qh and qt and stored and qh <= qt) then
    return fail('WRONGTYPE', NOT_OURS .. 'sliding window: a hash with other fields')
  end
end

-- A window without a TTL would hold its use forever, so it gets one on
-- whatever path follows, errors included: until its own counts have slid
-- out under the window it was written with, not this caller's. Every
-- error reply after it is marked.
local healed = 0
if pttl == -1 then
  local ttl = math.max(s + 2 * stored - now, 1)
  redis.call('PEXPIRE', key, ttl)
  pttl, healed = ttl, 1
end

if strict == '1' and stored_policy and stored_policy ~= policy then
  return fail('POLICY', 'live window has limit:window_ms ' .. stored_policy, healed)
end

-- A named policy's new limit applies at once to the counts; see
-- sliding_window's state for a new window.
local sw = sliding_window(window)
local prev, cur, start, elapsed = sw.state(now, s, c, p, stored)
local share = sw.share(prev, elapsed)

if id ~= '' and f[8] then
  local rc, ru, rx = string.match(f[8], '^(%d+):(%d+):(%d+)$')
  rx = dec(rx, 0, MAX_EXACT)
  ru = dec(ru, 0, 2 * MAX_LIMIT)
  if not rx or not ru then
    return fail('WRONGTYPE', NOT_OURS .. 'sliding window: malformed request id record', healed)
  end
  -- A record lasts as long as the take it records counts in any estimate:
  -- until the end of the period after the one it was counted in.
  if rx > now then
    if rc ~= cost_s then
      return fail('CONFLICT', 'request id was accepted with cost ' .. rc, healed)
    end
    return {1, 1, ru, limit > ru and limit - ru or 0, sw.reset(now, prev, cur, start), 0, healed}
  end
end

if share + cur + cost > limit then
  return {0, 0, share + cur, limit > share + cur and limit - share - cur or 0, sw.reset(now, prev, cur, start),
    sw.retry(limit, now, prev, cur, start, elapsed, cost), healed}
end

--#include prune q=q r=r head=qh tail=qt now=now expiry=:(%d+)$

cur = cur + cost
local used = share + cur
-- The take counts until the end of the next period: the key, and this
-- take's record, live that long (two windows at most).
local ends = start + 2 * window
local held = ids
if forgot > 0 then
  held = ids > forgot and ids - forgot or 0
end
if id ~= '' and not f[8] then
  -- An expired record of this id is overwritten, so it is not counted again.
  if held >= maxids then
    return fail('REQUEST_IDS_FULL', 'window holds ' .. held .. ' request ids', healed)
  end
  held = held + 1
end
-- Only the fields whose value changes are written: c always (cost >= 1);
-- s, p and policy when the period or the policy moved on; ids, qh and qt
-- when records came or went. A new window gets every field, in the order
-- the hash always had. redis.call sends a number as its exact decimal;
-- '..' writes one exactly below 10^14 (Redis's clock in ms stays below
-- that for millennia, but a stored period may be anywhere up to
-- MAX_EXACT). The HSET first (see the top): the fields it writes (this
-- id's record, the queue's new tail) are never among those dropped.
local qn = qt < 1e14 and qt or string.format('%d', qt)
local endd = ends < 1e14 and ends or string.format('%d', ends)
if pttl ~= -2 and start == s and prev == p and stored_policy == policy and popped == 0 then
  -- The usual take: the same period and policy, no record forgotten.
  if id == '' then
    if held == ids then
      redis.call('HSET', key, 'c', cur)
    else
      redis.call('HSET', key, 'c', cur, 'ids', held)
    end
  elseif held == ids then
    redis.call('HSET', key, 'c', cur, 'r:' .. id, cost_s .. ':' .. used .. ':' .. endd,
      'q:' .. qn, id .. ':' .. endd, 'qt', qt + 1)
  else
    redis.call('HSET', key, 'c', cur, 'r:' .. id, cost_s .. ':' .. used .. ':' .. endd,
      'q:' .. qn, id .. ':' .. endd, 'ids', held, 'qt', qt + 1)
  end
else
  local fields, n
  if pttl == -2 then
    fields, n = {'s', start, 'c', cur, 'p', prev, 'policy', policy}, 8
  else
    fields, n = {'c', cur}, 2
    if start ~= s then
      fields[3], fields[4], n = 's', start, 4
    end
    if prev ~= p then
      fields[n + 1], fields[n + 2], n = 'p', prev, n + 2
    end
    if stored_policy ~= policy then
      fields[n + 1], fields[n + 2], n = 'policy', policy, n + 2
    end
  end
  if id ~= '' then
    fields[n + 1], fields[n + 2] = 'r:' .. id, cost_s .. ':' .. used .. ':' .. endd
    fields[n + 3], fields[n + 4], n = 'q:' .. qn, id .. ':' .. endd, n + 4
  end
  if pttl == -2 or held ~= ids then
    fields[n + 1], fields[n + 2], n = 'ids', held, n + 2
  end
  if pttl == -2 or popped > 0 then
    fields[n + 1], fields[n + 2], n = 'qh', qh + popped, n + 2
  end
  if pttl == -2 or id ~= '' then
    fields[n + 1], fields[n + 2], n = 'qt', id ~= '' and qt + 1 or qt, n + 2
  end
  redis.call('HSET', key, unpack(fields, 1, n))
end
if drop and #drop > 0 then
  redis.call('HDEL', key, unpack(drop))
end
-- Under one window ends only moves on, so this never shortens the key's
-- life; after a named policy's window shrank it may, and the records of
-- the old window then go with the key once their takes no longer count
-- under the new one. A TTL that PTTL found already ending there, or a ms
-- later (takes of one period, each setting it from its own reading of the
-- clock), is left as it is: the PEXPIRE would change it by a ms at most.
local ttl = ends - now
if pttl < ttl or pttl > ttl + 1 then
  redis.call('PEXPIRE', key, math.max(ttl, 1))
end
if healed == 0 then
  return {1, 0, used, limit > used and limit - used or 0, ttl}
end
return {1, 0, used, limit > used and limit - used or 0, ttl, 0, healed}
