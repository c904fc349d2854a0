// Calls that go on while the sidecar is restarted under them.
//
//   QUOTAD_TEST_SOCKET=... QUOTAD_TEST_SUBJECT=... node restart.mjs ROUNDS
//
// Concurrent call chains on one Client take quota without pause. Each
// round, once calls have been answered, this prints "restart N" and waits
// for a line on stdin: the caller restarts the sidecar on the same socket
// in between and then writes that line. Afterwards every call is checked:
// a take with a request_id succeeded with its own reply and was counted
// exactly once; a take without one succeeded the same way, or rejected with
// OutcomeUnknown and was counted at most once; nothing else happened; and
// a client left idle across the restarts sends its next take, one without a
// request_id, on a new connection and gets its answer.
// Prints its figures as one JSON line; exits 1 if a check failed.

import readline from 'node:readline';

import { Client, OutcomeUnknown, QuotadError } from 'quotad';

const SOCKET = process.env.QUOTAD_TEST_SOCKET;
const PREFIX = process.env.QUOTAD_TEST_SUBJECT;
const CHAINS = 64;
const WINDOW_MS = 600000;

const params = (n) => ({ limit: 1000 + (n % 1000), window_ms: WINDOW_MS, cost: 1 + (n % 5) });

const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const q = new Client(SOCKET, { timeoutMs: 60000 });
const idle = await Client.connect(SOCKET, { timeoutMs: 60000 });
await idle.ping();
let seq = 0;
let calls = 0;
let stop = false;
const done = [];
const unknown = [];
const problems = [];
let wake = null;

async function chain(c) {
  const resendable = c % 4 !== 0; // one chain in four takes without a request_id
  while (!stop) {
    const n = seq++;
    const subject = `${PREFIX}-r-${n}`;
    try {
      const r = await q.take(subject, resendable ? { ...params(n), request_id: `id-${n}` } : params(n));
      if (r.allowed === true && r.limit === params(n).limit && r.used === params(n).cost) done.push(n);
      else problems.push(`${subject}: wrong reply ${JSON.stringify(r)}`);
    } catch (err) {
      if (err instanceof OutcomeUnknown && !resendable) unknown.push(n);
      else problems.push(`${subject}: ${err}`);
    }
    calls++;
    if (wake) wake();
  }
}

async function waitFor(n) {
  while (calls < n && problems.length === 0) await new Promise((resolve) => (wake = resolve));
  wake = null;
}

const rounds = Number(process.argv[2]);
const chains = Array.from({ length: CHAINS }, (_, c) => chain(c));
for (let r = 1; r <= rounds; r++) {
  await waitFor(calls + 300);
  console.log(`restart ${r}`);
  const { value, done: eof } = await lines.next();
  if (eof || value.trim() !== 'restarted') {
    problems.push('stdin closed before the sidecar was restarted');
    break;
  }
}
await waitFor(calls + 300);
stop = true;
await Promise.all(chains);

try {
  const r = await idle.take(`${PREFIX}-idle`, { limit: 1, window_ms: WINDOW_MS });
  if (!(r.allowed && r.used === 1)) problems.push(`idle client: wrong reply ${JSON.stringify(r)}`);
} catch (err) {
  problems.push(`idle client: ${err}`);
}
await idle.close();

const unknownSet = new Set(unknown);
let countedUnknown = 0;
for (const n of [...done, ...unknown]) {
  const p = await q.peek(`${PREFIX}-r-${n}`, { limit: params(n).limit, window_ms: WINDOW_MS });
  const cost = params(n).cost;
  if (unknownSet.has(n)) {
    if (p.used !== 0 && p.used !== cost) problems.push(`${PREFIX}-r-${n}: outcome unknown, counted ${p.used} of cost ${cost}`);
    if (p.used === cost) countedUnknown++;
  } else if (p.used !== cost) {
    problems.push(`${PREFIX}-r-${n}: counted ${p.used}, want ${cost}`);
  }
}
const reconnects = q.reconnects;
await q.close();
console.log(
  JSON.stringify({
    figures: 'node restart',
    rounds,
    calls,
    succeeded: done.length,
    outcome_unknown: unknown.length,
    outcome_unknown_counted: countedUnknown,
    problems: problems.length,
    reconnects,
  }),
);
for (const p of problems.slice(0, 20)) console.error('problem:', p);
if (reconnects === 0) console.error('problem: the client never reconnected');
process.exitCode = problems.length > 0 || reconnects === 0 ? 1 : 0;
process.stdin.destroy();
