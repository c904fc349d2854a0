-- The batch driver: several decisions, of any algorithm and op, in one
-- script call. batch.go composes the batch script at init: the prelude,
-- then every script's body wrapped as
--
--   local function BODY_<n>(KEYS, ARGV) <body> end
--
-- (a peek's flags line left out), then BODIES, the list of them in the
-- order of scripts in load.go, then this driver. Each body is the same text
-- its lone script runs, so a decision in a batch checks and decides exactly
-- as alone.
--
-- KEYS   every decision's keys, in decision order
-- ARGV   for each decision in turn:
--          body    index of its script in BODIES, canonical decimal
--          nkeys   how many of KEYS are its own, from the next unused one
--          nargs   how many arguments follow
--          its arguments, as its lone script takes them in ARGV
--
-- Reply: an array with one element per decision, in order: the reply its
-- lone script would send (an error element for an error reply). A layout
-- that does not add up (an unknown body, a count that is not a canonical
-- decimal up to MAX_COUNT, keys or arguments left over or missing, no
-- decision, more than MAX_BATCH) is INVALID for the whole call, decided
-- before any decision runs.
--
-- Each decision runs under pcall, so it is as atomic as alone and its
-- failure is its own element: a body's error reply (INVALID, CONFLICT,
-- POLICY, WRONGTYPE, REQUEST_IDS_FULL, CLOCK_SKEW) is returned by the body
-- before any write but a restored TTL, as its top says; an error Redis
-- raises in a body's redis.call (OOM) or a Lua runtime error ends that
-- decision there and is answered as its error element (Redis's error
-- with its code; "ERR " and the message for a runtime error), and the
-- next decision runs. The writes of
-- the earlier decisions stay, as they would after their lone calls.
--
-- Under maxmemory (noeviction) Redis refuses a script's first write that
-- may grow memory, and allows every write after one succeeded (it checks
-- only while the call has not written). Each body makes its deciding
-- write first (or a PEXPIRE, never refused, that restores a TTL), so:
-- while no decision of the call has written, decision k's first write is
-- refused exactly when its lone call's would be, the refusal is raised
-- before it wrote anything, and pcall answers it as decision k's own OOM
-- error; once an earlier decision wrote, decision k's writes are allowed,
-- as the later writes of one lone call are, and it decides in full. Either
-- way no decision is half-written, and a full Redis grows by at most one
-- call's decisions.

local out = {}
local nargv, nkeys = #ARGV, #KEYS
-- The layout first, so that a malformed one runs nothing.
local ap, kp, count = 1, 0, 0
while ap <= nargv do
  local b, nk, na = COUNT[ARGV[ap]], COUNT[ARGV[ap + 1]], COUNT[ARGV[ap + 2]]
  if not b or not BODIES[b] or not nk or not na then
    return redis.error_reply('INVALID batch: decision ' .. (count + 1) .. ' has no body, nkeys, nargs')
  end
  count, ap, kp = count + 1, ap + 3 + na, kp + nk
end
if count < 1 or count > MAX_BATCH or ap ~= nargv + 1 or kp ~= nkeys then
  return redis.error_reply('INVALID batch: want 1 to ' .. MAX_BATCH .. ' decisions whose counts add up to the keys and arguments')
end

ap, kp = 1, 0
for i = 1, count do
  local body, nk, na = BODIES[COUNT[ARGV[ap]]], COUNT[ARGV[ap + 1]], COUNT[ARGV[ap + 2]]
  local k, a = {}, {}
  for j = 1, nk do
    k[j] = KEYS[kp + j]
  end
  ap = ap + 2
  for j = 1, na do
    a[j] = ARGV[ap + j]
  end
  ap, kp = ap + na + 1, kp + nk
  local ok, r = pcall(body, k, a)
  if not ok then
    -- Redis raises a refused command's error reply as a string starting
    -- with its code (or, in some releases, as an error table, kept as it
    -- is); a Lua runtime error is a string without one.
    if type(r) ~= 'table' or type(r.err) ~= 'string' then
      r = tostring(r)
      if not string.find(r, '^%u[%u_]* ') then
        r = 'ERR ' .. r
      end
      r = redis.error_reply(r)
    end
  elseif r == nil then
    r = false
  end
  out[i] = r
end
return out
