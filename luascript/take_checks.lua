-- One take of several limits, all or nothing. takechecks.go joins, in this
-- order: the prelude, as to every script; then, as this script's body,
-- MAX_CHECKS, take_checks_redis.lua (the redis every take body below sees),
-- the prelude's helpers again (bound to that redis), each take body
-- (fixed_window_take.lua, ...) unchanged as a local function of (KEYS,
-- ARGV) in BODIES, then this text. The body is whole by itself, as every
-- script's is, so the batch script (batch.go) runs it as it runs any.
--
-- KEYS      every check's keys, check after check
-- ARGV[1]   n            canonical decimal, 1..MAX_CHECKS: checks
-- ARGV[2]   request_id   "" for none, else 1..MAX_REQUEST_ID_BYTES of [A-Za-z0-9_-]
-- ARGV[3]   digest       "" without a request id, else 16 hex digits: the
--                        set of checks and their costs (Go's ChecksDigest)
-- then for each check, in order:
--           body         the take body's name: fixed_window_take, ...
--           shadow       "1": its denial does not deny the take
--           nkeys        canonical decimal: its keys, the next ones of KEYS
--           nargs        canonical decimal: its arguments, which follow
--           its arguments, those its body reads as ARGV (its request_id
--           among them, equal to ARGV[2])
--
-- Reply {applied, reply of check 1, ..., reply of check n}: applied is 1
-- when the take consumed, 0 when it wrote nothing; each check's reply is
-- its body's, as Go's parser of that body reads it. An error reply is the
-- first check's refusal, its message starting "check <i>: ", and nothing
-- was written.
--
-- Two passes over the same checks:
--
--   1. Checking: every body runs with mt.dry set, so its reads go to Redis
--      and its writes nowhere. A body's error reply is the take's error
--      (with TTL_RESTORED taken off: nothing was restored). A replay of a
--      record that a take of another set of checks wrote is CONFLICT. If a
--      check that is not a shadow one denies, the take is denied: the
--      reply is this pass's, with healed 0, and nothing was written.
--   2. Applying: every body runs again with the real redis, in the same
--      order, and its reply is the check's.
--
-- Why the second pass decides as the first did. No body reads what it
-- wrote before in the same run (each reads its key first, then plans
-- with reads, then writes; the writes of the first pass never happen), and
-- no two checks share a key (Go refuses them), so in the second pass each
-- body reads what it read in the first, but for a key that expired in
-- between: Redis 7 freezes the clock of key expiry during a script, and
-- Redis 6 may not. TIME is read once and given to both passes. So each
-- body's inputs are the same, and so is its decision. For the one input
-- that can differ, a key that expired:
--   fixed window, calendar   no window is the path that always accepts
--                            (cost <= limit);
--   token bucket             no key is a full bucket, which accepts any
--                            cost <= burst;
--   sliding window           no key counts nothing, which accepts any
--                            cost <= limit;
--   concurrency              no key holds no lease, which grants one.
-- So a check that accepted in the first pass accepts in the second. Were
-- a body nevertheless to refuse there, the reply is an ERR naming it.
--
-- Under maxmemory (noeviction) Redis refuses only a script's first write
-- that may grow memory. Every write of this script is in the second pass,
-- which begins with the first check's first write: a PEXPIRE restoring a
-- TTL (never refused), or its HSET. Refused, it ends the script before any
-- HSET was made; after it, nothing is refused. So a full Redis leaves every
-- key as it was (but for restored TTLs) or the whole take applied.

--#include checks

mt.id, mt.digest = id, digest

-- Runs check i: its body's reply, or nil and the take's error reply.
local function run(i, c)
  mt.found = nil
  local r = c.body.fn(c.keys, c.args)
  if type(r) ~= 'table' then
    return nil, fail('ERR', 'check ' .. i .. ': its body answered no array')
  end
  if r.err then
    local code, msg = string.match(r.err, '^(%S+) (.*)$')
    if not code then
      code, msg = r.err, ''
    end
    if mt.dry then
      msg = string.gsub(msg, ' TTL_RESTORED$', '')
    end
    return nil, fail(code, 'check ' .. i .. ': ' .. msg)
  end
  -- Every take replies {allowed, replay, ...} (ParseTake).
  if r[1] == 1 and r[2] == 1 and mt.found and mt.found ~= digest then
    return nil, fail('CONFLICT', 'check ' .. i ..
      ': request id was accepted by a take of another set of checks or costs')
  end
  return r
end

local replies, accepted = {0}, true
mt.dry = true
for i = 1, n do
  local r, err = run(i, checks[i])
  if not r then
    return err
  end
  if r[7] then
    r[7] = 0 -- healed: nothing was restored (a short reply has none)
  end
  replies[i + 1] = r
  if r[1] ~= 1 and not checks[i].shadow then
    accepted = false
  end
end
if not accepted then
  return replies
end

mt.dry = false
replies = {1}
for i = 1, n do
  local c = checks[i]
  local r, err = run(i, c)
  if not r then
    return fail('ERR', 'check ' .. i .. ' refused in the applying pass, after the checks before it applied: ' .. (err.err or ''))
  end
  replies[i + 1] = r
end
return replies
