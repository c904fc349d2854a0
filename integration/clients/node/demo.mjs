// Walk through quotad's take semantics against a running sidecar.
//
//   node demo.mjs ./quotad.sock demo-$(date +%s)
//
// Prints one JSON line per step; exits 1 (with the reason on stderr) if the
// sidecar does not answer as expected. Use a fresh subject for each run: the
// window lasts 60 s and remembers request ids.

import { Client, QuotadError } from './quotad.mjs';

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
  expect(!r.allowed && r.used === 5, 'order-3 denied, used 5', r);

  // Reusing a request_id with a different cost is a client bug.
  try {
    r = await q.take(subject, { limit: LIMIT, window_ms: WINDOW_MS, cost: 1, request_id: 'order-1' });
    show('take', r);
    expect(false, 'error CONFLICT', r);
  } catch (err) {
    if (!(err instanceof QuotadError)) throw err;
    show('take', err.reply);
    expect(err.code === 'CONFLICT', 'error CONFLICT', err.reply);
  }

  // Ten concurrent takes on one connection against a limit of 3: all are
  // written before any reply arrives, and replies come back in order.
  const ids = Array.from({ length: 10 }, (_, i) => `p-${i}`);
  const replies = await Promise.all(
    ids.map((id) => q.take(`${subject}-pipe`, { id, limit: 3, window_ms: WINDOW_MS })),
  );
  show('pipeline', replies);
  expect(replies.every((r, i) => r.id === ids[i]), 'replies in request order (ids p-0..p-9)', replies);
  expect(replies.filter((r) => r.allowed).length === 3, 'exactly 3 allowed', replies);

  // A token bucket: 3 tokens, one more every 20 s; no window boundary.
  const bucket = { algorithm: 'token_bucket', rate: 1, period_ms: 20000, burst: 3 };
  r = await q.take(`${subject}-tb`, { ...bucket, cost: 2, request_id: 'upload-1' });
  show('take', r);
  expect(r.allowed && r.remaining === 1, 'upload-1 allowed, 1 token left', r);
  r = await q.take(`${subject}-tb`, { ...bucket, cost: 2, request_id: 'upload-2' });
  show('take', r);
  expect(!r.allowed && r.retry_after_ms > 0, 'upload-2 denied with retry_after_ms', r);

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
  r = await q.release(`${subject}-cc`, 'job-1', jobs);
  show('release', r);
  expect(r.released && r.used === 1, 'job-1 released', r);
  r = await q.take(`${subject}-cc`, { ...jobs, request_id: 'job-3' });
  show('take', r);
  expect(r.allowed, 'job-3 granted after the release', r);
  for (const job of ['job-2', 'job-3']) await q.release(`${subject}-cc`, job, jobs);
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
    const why = err instanceof Failed ? err.message : `${err.name}: ${err.message}`;
    process.stderr.write(`demo failed: ${why}\n`);
    return 1;
  } finally {
    if (q) await q.close();
  }
}

process.exitCode = await main(process.argv.slice(2));
