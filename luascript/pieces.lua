-- Pieces of script bodies that several scripts share, written once. A
-- body's line "--#include <name> k=v ..." is replaced, when scripts.go
-- assembles the script at init, by the piece of that name, each ${k} in it
-- by v: plain text in the script, no function call, so a piece costs what
-- the lines it holds cost. Each piece starts at a line "--#piece <name>"
-- and says which locals it reads and which it makes.

--#piece window_heal
-- A fixed window (reads key, f[2] its policy, pttl, window, strict,
-- policy; makes healed). A window without a TTL would hold its quota
-- forever, so it gets one on whatever path follows, errors included: the
-- window's own length when it is sane, not this caller's (a caller
-- refused for other limits must not decide how long the window lives).
-- Every error reply after it is marked.
local healed = 0
if pttl == -1 then
  local own = dec(string.match(f[2], ':(%d+)$'), 1, MAX_WINDOW_MS) or window
  redis.call('PEXPIRE', key, own)
  pttl, healed = own, 1
end
if strict == '1' and f[2] ~= policy then
  return fail('POLICY', 'live window has limit:window_ms ' .. f[2], healed)
end

--#piece window_read
-- A fixed or calendar window's one read (reads key; makes f, the fields
-- used, policy and then ${fields}, and pttl), with the WRONGTYPE guard.
local f = redis.pcall('HMGET', key, 'used', 'policy', ${fields})
if f.err then
  return failed_read('window', f)
end
local pttl = redis.call('PTTL', key)

--#piece window_open
-- A fixed or calendar window's first take (reads key, pttl, id, cost_s,
-- cost, limit, and ${policy}, ${ttl} and ${reset}): with no window, cost
-- <= limit and max_ids >= 1, so the first take is always accepted; the
-- window opens now and its end never moves afterwards.
if pttl == -2 then
  if id == '' then
    redis.call('HSET', key, 'used', cost_s, 'policy', ${policy}, 'ids', '0')
  else
    redis.call('HSET', key, 'used', cost_s, 'policy', ${policy}, 'ids', '1', 'r:' .. id, cost_s .. ':' .. cost_s)
  end
  redis.call('PEXPIRE', key, ${ttl})
  return {1, 0, cost, limit - cost, ${reset}, 0, 0}
end

--#piece calendar_period
-- A calendar window's period (reads e1..e4; makes edges, now, key, ttl and
-- reset): the one of the three holding Redis's TIME, else CLOCK_SKEW. The
-- key lives until its period's end plus MARGIN_MS.
local MARGIN_MS = 1000
local edges = {e1, e2, e3, e4}
local _, now = redis_now()
local p
for i = 1, 3 do
  if edges[i] <= now and now < edges[i + 1] then
    p = i
  end
end
if not p then
  return fail('CLOCK_SKEW', 'redis time ' .. now .. ' ms is outside the periods from ' ..
    edges[1] .. ' to ' .. edges[4] .. ': the sidecar clock is more than a period away from redis')
end
local key, ttl, reset = KEYS[p], edges[p + 1] + MARGIN_MS - now, edges[p + 1] - now

--#piece calendar_heal
-- A calendar window (reads key, f[2] its policy, pttl, ttl, strict, spec;
-- makes healed). The key names its period, so its end is known whoever
-- wrote it.
local healed = 0
if pttl == -1 then
  redis.call('PEXPIRE', key, ttl)
  healed = 1
end
if strict == '1' and f[2] ~= spec then
  return fail('POLICY', 'live window has limit:period:zone:week_start:jitter_ms ' .. f[2], healed)
end

--#piece window_replay
-- A fixed or calendar window's take (reads f[4] the record of id, id,
-- cost_s, cost, used, limit, healed and ${reset}): a replay of a recorded
-- id, else a denial when the take does not fit, told to retry when the
-- window ends. A named policy's new
-- limit applies at once against the recorded use.
if id ~= '' and f[4] then
  local rc, ru = string.match(f[4], '^(%d+):(%d+)$')
  ru = dec(ru, 1, MAX_LIMIT)
  if not ru then
    return fail('WRONGTYPE', NOT_OURS .. 'window: malformed request id record', healed)
  end
  if rc ~= cost_s then
    return fail('CONFLICT', 'request id was accepted with cost ' .. rc, healed)
  end
  return {1, 1, ru, limit > ru and limit - ru or 0, ${reset}, 0, healed}
end
if used + cost > limit then
  return {0, 0, used, limit > used and limit - used or 0, ${reset}, ${reset}, healed}
end

--#piece window_settle
-- A fixed or calendar window's settle, from its record on (reads key, f[3]
-- the record of id, f[4] its settlement, id, cost_s, cost, used, limit,
-- healed and ${reset}, until the window ends). What a take of 1 would be
-- told: a window frees capacity when it ends. used holds this take's
-- reservation, so it stays at least cost; the bounds are kept whatever
-- another writer left.
local function retry(u)
  if u >= limit then
    return ${reset}
  end
  return 0
end
if not f[3] then
  return {0, 0, 0, used, limit > used and limit - used or 0, ${reset}, retry(used), healed}
end
local rc, ru, rest = string.match(f[3], '^(%d+):(%d+)(.*)$')
local reserved = dec(rc, 1, MAX_LIMIT)
if not reserved or not dec(ru, 1, MAX_LIMIT) or rest ~= '' and string.sub(rest, 1, 1) ~= ':' then
  return fail('WRONGTYPE', NOT_OURS .. 'window: malformed request id record', healed)
end
if f[4] then
  local sc, srest = string.match(f[4], '^(%d+)(.*)$')
  if not dec(sc, 0, MAX_LIMIT) or srest ~= '' and string.sub(srest, 1, 1) ~= ':' then
    return fail('WRONGTYPE', NOT_OURS .. 'window: malformed settlement', healed)
  end
  if sc ~= cost_s then
    return fail('CONFLICT', 'request id was settled with cost ' .. sc, healed)
  end
  return {1, 1, reserved, used, limit > used and limit - used or 0, ${reset}, retry(used), healed}
end
used = math.min(math.max(used + cost - reserved, 0), MAX_LIMIT)
redis.call('HSET', key, 'used', string.format('%d', used), 's:' .. id, cost_s)
return {1, 0, reserved, used, limit > used and limit - used or 0, ${reset}, retry(used), healed}

--#piece bucket_heal
-- A token bucket (reads key, pttl, g, tat, rem, ids, dedupe; makes
-- healed). The key lives until the bucket is full again, and as long as
-- its newest request-id record, whichever is later; one that lost its TTL
-- gets it back whatever follows, errors included.
local healed = 0
if pttl == -1 then
  local ttl = g.ms_until(tat, rem)
  if ids > 0 then
    ttl = math.max(ttl, dedupe)
  end
  ttl = math.max(ttl, 1)
  redis.call('PEXPIRE', key, ttl)
  pttl, healed = ttl, 1
end

--#piece prune
-- Plans, with reads only, to forget up to three entries of the queue
-- ${q}:<n>, from ${head} to ${tail}, past their expiry, oldest first, and
-- the field ${r}:<id> each names when its own expiry (the capture of
-- ${expiry}) has passed too: one renewed after its entry was queued is
-- newer than the entry and stays. This call's own id is written after,
-- never forgotten. Makes drop (the fields to delete: nil or empty for
-- none), popped (the entries) and forgot (the ${r}:<id>); a call adds at most one entry, so
-- under any traffic the queue stays bounded. Reads key, id and ${now}.
local drop, popped, forgot = nil, 0, 0
if ${head} < ${tail} then
  -- '..' writes a number below 10^14 as its exact decimal.
  local qf
  if ${tail} < 1e14 then
    qf = {'${q}:' .. ${head}, '${q}:' .. ${head} + 1, '${q}:' .. ${head} + 2}
  else
    qf = {'${q}:' .. string.format('%d', ${head}), '${q}:' .. string.format('%d', ${head} + 1),
      '${q}:' .. string.format('%d', ${head} + 2)}
  end
  for i = ${tail} - ${head} + 1, 3 do
    qf[i] = nil
  end
  local qs = redis.call('HMGET', key, unpack(qf))
  local rf, seen = {}, {}
  drop = {}
  for i = 1, #qf do
    local qid, qx = string.match(qs[i] or '', '^(.+):(%d+)$')
    qx = dec(qx, 0, MAX_EXACT)
    if qx and qx > ${now} then
      break
    end
    drop[#drop + 1] = qf[i]
    popped = popped + 1
    if qid and qid ~= id and not seen[qid] then
      seen[qid] = true
      rf[#rf + 1] = '${r}:' .. qid
    end
  end
  if #rf > 0 then
    local recs = redis.call('HMGET', key, unpack(rf))
    for i = 1, #rf do
      local rec = recs[i]
      local rx = rec and dec(string.match(rec, '${expiry}'), 0, MAX_EXACT)
      if rec and (not rx or rx <= ${now}) then
        drop[#drop + 1] = rf[i]
        forgot = forgot + 1
      end
    end
  end
end

--#piece lease_scan
-- A lease set (reads key, now, policy and own, the field of this call's
-- lease or nil): one read of the whole hash, which holds at most limit
-- live leases. Makes stored (its policy), mine (the expiry of own, when
-- live), live (the other live leases), expired (their fields, or nil),
-- first and last (the earliest and latest expiry of the other live
-- leases). Each field is checked with one match of its name and dec of
-- its value, and compared with plain operators: no capture, no math call.
local all = redis.pcall('HGETALL', key)
if all.err then
  return failed_read('lease set', all)
end
local stored, mine = nil, nil
local live, expired, first, last = 0, nil, nil, 0
for i = 1, #all, 2 do
  local k, v = all[i], all[i + 1]
  if k == 'policy' and (v == policy or string.find(v, '^%d+:%d+$')) then
    stored = v
  else
    local x = dec(v, 0, MAX_EXACT)
    if not x or not string.find(k, '^l:.') then
      return fail('WRONGTYPE', NOT_OURS .. 'lease set: a hash with other fields')
    end
    if x <= now then
      expired = expired or {}
      expired[#expired + 1] = k
    elseif k == own then
      mine = x
    else
      live = live + 1
      if not first or x < first then
        first = x
      end
      if x > last then
        last = x
      end
    end
  end
end
if #all > 0 and not stored then
  return fail('WRONGTYPE', NOT_OURS .. 'lease set: a hash with other fields')
end

--#piece checks
-- The checks of a take of several limits (take_checks.lua, and its give
-- back): n, id, digest, and checks, each {body, shadow, keys, args}: its
-- body's entry of BODIES (takechecks.go writes it: at names the place in
-- args of each argument of the take's contract), its keys and its
-- arguments.
local n = dec(ARGV[1], 1, MAX_CHECKS)
if not n then
  return fail('INVALID', 'want 1..' .. MAX_CHECKS .. ' checks')
end
local id, digest = ARGV[2], ARGV[3]
if id ~= '' and (#id > MAX_REQUEST_ID_BYTES or not string.find(id, REQUEST_ID)) then
  return fail('INVALID', REQUEST_ID_RULE)
end
if (id == '') ~= (digest == '') or digest ~= '' and not string.find(digest, '^%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x$') then
  return fail('INVALID', 'digest must be 16 hex digits with a request id, empty without')
end
local checks, a, k = {}, 4, 1
for i = 1, n do
  local body, shadow = BODIES[ARGV[a]], ARGV[a + 1]
  local nkeys, nargs = dec(ARGV[a + 2], 1, 3), dec(ARGV[a + 3], 1, 16)
  if not body or (shadow ~= '0' and shadow ~= '1') or not nkeys or not nargs
      or k + nkeys - 1 > #KEYS or a + 3 + nargs > #ARGV then
    return fail('INVALID', 'check ' .. i .. ': want body, shadow, nkeys, nargs and its arguments')
  end
  local ck, ca = {}, {}
  for j = 1, nkeys do
    ck[j] = KEYS[k + j - 1]
  end
  for j = 1, nargs do
    ca[j] = ARGV[a + 3 + j]
  end
  if ca[body.at.id] ~= id then
    return fail('INVALID', 'check ' .. i .. ': its request_id is not the take\'s')
  end
  checks[i] = {body = body, shadow = shadow == '1', keys = ck, args = ca}
  a, k = a + 4 + nargs, k + nkeys
end
if a - 1 ~= #ARGV or k - 1 ~= #KEYS then
  return fail('INVALID', 'arguments or keys left over after the checks')
end

--#piece allot_grant
-- A reservation's size (reads cost, want, share and ${left}, what the
-- limit leaves now; makes grant): what the sidecar wants, at most
-- max_share of what is left (in parts of SHARE_SCALE) and at least the
-- take's cost, and never more than is left. The caller has denied a cost
-- that does not fit. left * share stays below 2^53, and its quotient is at
-- least 1/SHARE_SCALE from the next integer unless it is one, so the floor
-- is exact.
local grant = math.floor(${left} * share / SHARE_SCALE)
grant = math.min(want, ${left}, math.max(cost, grant))

--#piece allot_record
-- A reservation's record (reads f[${at}] the holder's record and kind,
-- what the key is; makes held, the units it records, and tail, what
-- follows them, or the WRONGTYPE reply). One field a holder,
-- "<seq>:<units>" (a sliding window's adds ":<period start>"): a holder's
-- next reservation replaces it with its own seq, and its units with what
-- it grants plus the units the holder kept of the earlier ones (kept, at
-- most what the record held), so the fields stay as few as the sidecars
-- and their numbers as small as what they hold.
local held, tail = 0, ''
if f[${at}] then
  local rs, ru
  rs, ru, tail = string.match(f[${at}], '^(%d+):(%d+)(.*)$')
  held = dec(ru, 0, MAX_LIMIT)
  if not held or not dec(rs, 1, MAX_EXACT) or tail ~= '' and not string.find(tail, '^:%d+$') then
    return fail('WRONGTYPE', NOT_OURS .. kind .. ': malformed reservation record', healed)
  end
end
