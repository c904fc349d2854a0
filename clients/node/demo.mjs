// Walk through quotad's semantics with the Node client.
//
//   node demo.mjs ./quotad.sock demo-$(date +%s)
//
// Prints one JSON line per step; exits 1 (with the reason on stderr) if the
// sidecar does not answer as expected. Use a fresh subject for each run: the
// window lasts 60 s and remembers request ids.

import { Client, Conflict, Invalid, QuotadError } from 'quotad';

const LIMIT = 5;
const WINDOW_MS = 60000;

class Failed extends Error {}

function show(step, reply) {
  process.stdout.write(JSON.stringify({ step, reply }) + '\n');
}

function expect(cond, what, reply) {
  if (!cond) throw new Failed(`expected ${what}, got ${JSON.stringify(reply)}`);
}

async function run(q, subject) {
  const take = async (request_id, cost) => {
    const reply = await q.take(subject, { limit: LIMIT, window_ms: WINDOW_MS, cost, request_id });
    show('take', reply);
    return reply;
  };

  let r = await take('order-1', 2);
  expect(r.allowed && !r.replay && r.used === 2, 'order-1 allowed, used 2', r);

  // Same request_id again, as a retry would: the original answer, nothing consumed.
  r = await take('order-1', 2);
  expect(r.allowed && r.replay && r.used === 2, 'order-1 replayed, used 2', r);

  r = await take('order-2', 3);
  expect(r.allowed && !r.replay && r.used === 5, 'order-2 allowed, used 5', r);

  // Over the limit: a denial is an answer, not an error.
  r = await take('order-3', 1);
  expect(!r.allowed && r.used === 5 && r.retry_after_ms > 0, 'order-3 denied, used 5', r);

  // Reusing a request_id with a different cost is a client bug: Conflict.
  try {
    r = await q.take(subject, { limit: LIMIT, window_ms: WINDOW_MS, cost: 1, request_id: 'order-1' });
    expect(false, 'error CONFLICT', r);
  } catch (err) {
    if (!(err instanceof Conflict)) throw err;
    show('conflict', err.reply);
    expect(err.code === 'CONFLICT', 'error CONFLICT', err.reply);
  }

  // A bad value is the sidecar's INVALID; a misspelled option never leaves
  // the process.
  try {
    await q.take(subject, { limit: LIMIT, window_ms: WINDOW_MS, cost: -1 });
    expect(false, 'error INVALID', null);
  } catch (err) {
    if (!(err instanceof Invalid)) throw err;
    show('invalid', { code: err.code, message: err.message });
  }
  try {
    await q.take(subject, { limit: LIMIT, window_ms: WINDOW_MS, requestId: 'order-4' });
    expect(false, 'TypeError for requestId', null);
  } catch (err) {
    if (!(err instanceof TypeError)) throw err;
    show('unknown option', { error: err.message });
  }

  // Ten concurrent takes on one connection against a limit of 3.
  const replies = await Promise.all(
    Array.from({ length: 10 }, () => q.take(`${subject}-pipe`, { limit: 3, window_ms: WINDOW_MS })),
  );
  show('concurrent', replies);
  expect(replies.filter((x) => x.allowed).length === 3, 'exactly 3 allowed', replies);
  expect(replies.map((x) => x.used).sort().join() === '1,2,3,3,3,3,3,3,3,3', 'used 1, 2, 3 and then 3', replies);

  // Concurrency leases: at most 2 jobs at once; a lease is released when done.
  const jobs = { algorithm: 'concurrency', limit: 2, lease_ms: 30000 };
  for (const job of ['job-1', 'job-2']) {
    r = await q.take(`${subject}-cc`, { ...jobs, request_id: job });
    show('take', r);
    expect(r.allowed && r.lease_ms === 30000, `${job} granted a lease`, r);
  }
  r = await q.take(`${subject}-cc`, { ...jobs, request_id: 'job-3' });
  show('take', r);
  expect(!r.allowed, 'job-3 denied while 2 leases are held', r);
  const rel = await q.release(`${subject}-cc`, 'job-1', jobs);
  show('release', rel);
  expect(rel.released && rel.used === 1, 'job-1 released', rel);
  for (const job of ['job-2', 'job-3']) await q.release(`${subject}-cc`, job, jobs);

  // A calendar window: 2 units per day of Shanghai's clock, reset at its midnight.
  const day = { algorithm: 'calendar', limit: 2, period: 'day', time_zone: 'Asia/Shanghai' };
  r = await q.take(`${subject}-cal`, { ...day, cost: 2, request_id: 'day-1' });
  show('take', r);
  expect(r.allowed && r.used === 2 && r.reset_ms > 0 && r.reset_ms <= 86400000, "the day's quota taken", r);
  r = await q.take(`${subject}-cal`, day);
  show('take', r);
  expect(!r.allowed && r.retry_after_ms === r.reset_ms, "denied until Shanghai's midnight", r);
  const p = await q.peek(`${subject}-cal-week`, { algorithm: 'calendar', limit: 5, period: 'week', week_start: 'sunday' });
  show('peek', p);
  expect(p.used === 0 && p.reset_ms <= 7 * 86400000, 'an unused week, reset at its end', p);
}

async function main(argv) {
  if (argv.length !== 2) {
    process.stderr.write('usage: demo.mjs <socket_path> <subject>\n');
    return 2;
  }
  let q;
  try {
    q = await Client.connect(argv[0]);
    await run(q, argv[1]);
    return 0;
  } catch (err) {
    if (!(err instanceof Failed || err instanceof QuotadError)) throw err;
    process.stderr.write(`demo failed: ${err.name}: ${err.message}\n`);
    return 1;
  } finally {
    if (q) await q.close();
  }
}

process.exitCode = await main(process.argv.slice(2));
