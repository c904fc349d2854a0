// Tests of the quotad package against a running sidecar:
//
//   QUOTAD_TEST_SOCKET=./quotad.sock QUOTAD_TEST_SUBJECT=run-1 node --test test/
//
// QUOTAD_TEST_SUBJECT prefixes every subject, so runs do not share windows.
// Every call has a subject and a limit of its own, so a reply given to the
// wrong caller shows in its fields.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import * as quotad from 'quotad';

import { recordingServer } from './recording.mjs';

const SOCKET = process.env.QUOTAD_TEST_SOCKET ?? './quotad.sock';
const PREFIX = process.env.QUOTAD_TEST_SUBJECT ?? 'jstest';
const WORKERS = 16;
const PER_WORKER = 300;
const CONCURRENT = 1000;

function figures(name, values) {
  console.log(JSON.stringify({ figures: name, ...values }));
}

// The limit and cost of call n: both differ between neighbours.
function expected(n) {
  return { limit: 1000 + n, cost: 1 + (n % 7) };
}

function mismatch(reply, n) {
  const { limit, cost } = expected(n);
  return !(reply.ok === true && reply.allowed === true && reply.limit === limit && reply.used === cost && reply.remaining === limit - cost);
}

// A socket that accepts connections and never answers.
async function silentServer(t) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'qd'));
  const file = path.join(dir, 'silent.sock');
  const conns = [];
  const server = net.createServer((c) => conns.push(c));
  await new Promise((resolve) => server.listen(file, resolve));
  t.after(async () => {
    for (const c of conns) c.destroy();
    await new Promise((resolve) => server.close(resolve));
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return file;
}

const TRACEPARENT = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

test('every operation sends the trace context it is given, and none of its own', async (t) => {
  const srv = await recordingServer(t);
  const q = await quotad.Client.connect(srv.file);
  const trace = { traceparent: TRACEPARENT, tracestate: 'vendor=x' };
  const inline = { limit: 1, window_ms: 1000 };
  await q.take('s', { ...inline, ...trace });
  await q.peek('s', { ...inline, ...trace });
  await q.release('s', 'r-1', { algorithm: 'concurrency', limit: 1, lease_ms: 1000, ...trace });
  await q.settle('s', { ...inline, request_id: 'r-1', cost: 0, ...trace });
  await q.takeChecks([{ subject: 's', ...inline }], trace);
  await q.take('s', inline);
  await q.take('s', { ...inline, traceparent: null });
  await q.close();
  assert.deepEqual(srv.requests.map((r) => [r.op, r.traceparent, r.tracestate]), [
    ...['take', 'peek', 'release', 'settle', 'take'].map((op) => [op, TRACEPARENT, 'vendor=x']),
    ['take', undefined, undefined], ['take', undefined, undefined]]);
});

test('the sidecar decides a traced take as without', async () => {
  const q = await quotad.Client.connect(SOCKET);
  const s = `${PREFIX}-traced`;
  assert.equal((await q.take(s, { limit: 1, window_ms: 2678400000, traceparent: TRACEPARENT })).allowed, true);
  assert.equal((await q.take(s, { limit: 1, window_ms: 2678400000, traceparent: 'not a trace context' })).allowed, false);
  await q.close();
});

test('16 workers share one client', async () => {
  const q = await quotad.Client.connect(SOCKET, { timeoutMs: 60000 });
  const bad = [];
  const worker = async (w) => {
    for (let i = 0; i < PER_WORKER; i++) {
      const n = w * PER_WORKER + i;
      const { limit, cost } = expected(n);
      const r = await q.take(`${PREFIX}-wrk-${n}`, { limit, window_ms: 60000, cost, request_id: `w${w}-${i}` });
      if (mismatch(r, n)) bad.push(`call ${n}: ${JSON.stringify(r)}`);
    }
  };
  await Promise.all(Array.from({ length: WORKERS }, (_, w) => worker(w)));
  const { limit, cost } = expected(7);
  const replay = await q.take(`${PREFIX}-wrk-7`, { limit, window_ms: 60000, cost, request_id: 'w0-7' });
  figures('node workers', { workers: WORKERS, calls: WORKERS * PER_WORKER, mismatches: bad.length, reconnects: q.reconnects });
  await q.close();
  assert.deepEqual(bad, []);
  assert.equal(replay.replay, true);
  assert.equal(replay.used, cost);
});

test('1000 concurrent calls on one client', async () => {
  const q = new quotad.Client(SOCKET, { timeoutMs: 60000 });
  const idx = Array.from({ length: CONCURRENT }, (_, n) => n);
  const takes = await Promise.all(
    idx.map((n) => q.take(`${PREFIX}-con-${n}`, { limit: expected(n).limit, window_ms: 60000, cost: expected(n).cost })),
  );
  const bad = takes.flatMap((r, n) => (mismatch(r, n) ? [`take ${n}: ${JSON.stringify(r)}`] : []));
  const peeks = await Promise.all(idx.map((n) => q.peek(`${PREFIX}-con-${n}`, { limit: expected(n).limit, window_ms: 60000 })));
  peeks.forEach((p, n) => {
    if (p.used !== expected(n).cost || p.limit !== expected(n).limit) bad.push(`peek ${n}: ${JSON.stringify(p)}`);
  });
  figures('node concurrent', { calls: 2 * CONCURRENT, mismatches: bad.length, reconnects: q.reconnects });
  await q.close();
  assert.deepEqual(bad, []);
});

test('each error code has its class', async () => {
  const q = await quotad.Client.connect(SOCKET);
  const s = `${PREFIX}-err`;
  await q.take(s, { limit: 5, window_ms: 60000, cost: 2, request_id: 'order-1' });
  const cases = [
    [quotad.Conflict, 'CONFLICT', () => q.take(s, { limit: 5, window_ms: 60000, cost: 1, request_id: 'order-1' })],
    [quotad.Invalid, 'INVALID', () => q.take(s, { limit: 5, window_ms: 60000, cost: -1 })],
    [quotad.PolicyMismatch, 'POLICY', () => q.take(s, { limit: 6, window_ms: 60000 })],
    [quotad.UnknownPolicy, 'UNKNOWN_POLICY', () => q.take(s, { policy: 'no-such-policy' })],
    [quotad.TooLarge, 'TOO_LARGE', () => q.take('x'.repeat(20000), { limit: 5, window_ms: 60000 })],
  ];
  for (const [Cls, code, call] of cases) {
    await assert.rejects(call(), (err) => {
      assert.ok(err instanceof Cls, `${code}: got ${err}`);
      assert.ok(err instanceof quotad.QuotadError);
      assert.equal(err.code, code);
      assert.equal(err.reply.error, code);
      assert.ok(err.message.length > 0);
      return true;
    });
  }
  // A denial is a reply.
  const d = await q.take(s, { limit: 5, window_ms: 60000, cost: 4 });
  assert.equal(d.allowed, false);
  assert.ok(d.retry_after_ms > 0);
  await q.close();

  const unknown = quotad.errorFromReply({ ok: false, error: 'SOMETHING_NEW', message: 'm' });
  assert.ok(unknown instanceof quotad.Internal);
  assert.equal(unknown.code, 'SOMETHING_NEW');
  for (const [code, Cls] of [
    ['UNAVAILABLE', quotad.Unavailable],
    ['SHUTTING_DOWN', quotad.ShuttingDown],
    ['WRONGTYPE', quotad.WrongType],
    ['REQUEST_IDS_FULL', quotad.RequestIdsFull],
    ['INTERNAL', quotad.Internal],
  ]) {
    assert.equal(quotad.errorFromReply({ ok: false, error: code, message: '' }).constructor, Cls);
  }
});

test('release, pipeline and ping', async () => {
  const q = await quotad.Client.connect(SOCKET);
  const s = `${PREFIX}-lease`;
  const jobs = { algorithm: 'concurrency', limit: 1, lease_ms: 30000 };
  assert.equal((await q.take(s, { ...jobs, request_id: 'job-1' })).allowed, true);
  assert.equal((await q.take(s, { ...jobs, request_id: 'job-2' })).allowed, false);
  assert.equal((await q.release(s, 'job-1', jobs)).released, true);
  assert.equal((await q.release(s, 'job-1', jobs)).released, false);
  const replies = await q.pipeline([{ op: 'ping', id: 'p' }, { op: 'launch' }]);
  assert.equal(replies[0].id, 'p');
  assert.equal(replies[0].ok, true);
  assert.equal(replies[1].error, 'INVALID');
  assert.equal((await q.ping()).ok, true);
  await q.close();
});

test('settle', async () => {
  const q = await quotad.Client.connect(SOCKET);
  const s = `${PREFIX}-settle`;
  const w = { limit: 10000, window_ms: 60000 };
  assert.equal((await q.take(s, { ...w, cost: 2000, request_id: 'call-1' })).used, 2000);
  const r = await q.settle(s, { ...w, request_id: 'call-1', cost: 1234 });
  assert.deepEqual([r.settled, r.replay, r.reserved, r.used, r.remaining], [true, false, 2000, 1234, 8766]);
  assert.equal((await q.settle(s, { ...w, request_id: 'call-1', cost: 1234 })).replay, true);
  await assert.rejects(q.settle(s, { ...w, request_id: 'call-1', cost: 1500 }), quotad.Conflict);
  const none = await q.settle(s, { ...w, request_id: 'never', cost: 0 });
  assert.equal(none.settled, false);
  assert.equal(none.used, 1234);
  const b = { algorithm: 'token_bucket', rate: 1, period_ms: 3600000, burst: 10 };
  await q.take(`${s}-b`, { ...b, cost: 6, request_id: 'up-1' });
  const refund = await q.settle(`${s}-b`, { ...b, request_id: 'up-1', cost: 0, headers: true });
  assert.deepEqual([refund.settled, refund.remaining], [true, 10]);
  assert.equal(quotad.rateLimitHeaders(refund)['Retry-After'], undefined);
  await assert.rejects(q.settle(s, { ...w, cost: 1 }), TypeError);
  await assert.rejects(q.settle(s, { ...w, request_id: 'call-1' }), TypeError);
  await assert.rejects(q.settle(s, { ...w, request_id: 'call-1', cost: 1, lease_ms: 1 }), TypeError);
  await q.close();
});

test('sliding window', async () => {
  const q = await quotad.Client.connect(SOCKET);
  const s = `${PREFIX}-sliding`;
  const sw = { algorithm: 'sliding_window', limit: 3, window_ms: 2678400000 };
  const r = await q.take(s, { ...sw, cost: 2, request_id: 'sw-1' });
  assert.equal(r.allowed, true);
  assert.equal(r.used, 2);
  assert.equal((await q.take(s, { ...sw, cost: 2, request_id: 'sw-1' })).replay, true);
  const denied = await q.take(s, { ...sw, cost: 2 });
  assert.equal(denied.allowed, false);
  assert.ok(denied.retry_after_ms > 0);
  assert.equal((await q.peek(s, sw)).used, 2);
  await q.close();
});

test('RateLimit header fields', async () => {
  const q = await quotad.Client.connect(SOCKET);
  const s = `${PREFIX}-headers`;
  const bucket = { algorithm: 'token_bucket', rate: 1, period_ms: 10000, burst: 2 };
  const secs = (ms) => Math.ceil(ms / 1000);
  assert.deepEqual(quotad.rateLimitHeaders(await q.take(s, { ...bucket, headers: false })), {});
  const r = await q.take(s, { ...bucket, headers: true });
  assert.equal(r.allowed, true);
  assert.deepEqual(quotad.rateLimitHeaders(r), {
    'RateLimit-Policy': '"inline";q=2;w=20',
    RateLimit: `"inline";r=0;t=${secs(r.reset_ms)}`,
  });
  const d = await q.take(s, { ...bucket, headers: true });
  assert.equal(d.allowed, false);
  assert.equal(quotad.rateLimitHeaders(d)['Retry-After'], String(secs(d.retry_after_ms)));
  const p = await q.peek(s, { ...bucket, headers: true });
  assert.equal(quotad.rateLimitHeaders(p).RateLimit, `"inline";r=${p.remaining};t=${secs(p.reset_ms)}`);
  await assert.rejects(q.take(s, { ...bucket, headers: 'yes' }), TypeError);
  assert.deepEqual(quotad.rateLimitHeaders({ ok: true }), {});
  await q.close();
});

test('a take of several limits, all or nothing', async () => {
  const q = await quotad.Client.connect(SOCKET);
  const user = { subject: `${PREFIX}-multi-user`, limit: 5, window_ms: 2678400000 };
  const tenant = { subject: `${PREFIX}-multi-tenant`, algorithm: 'token_bucket', rate: 1, period_ms: 600000, burst: 3 };
  const r = await q.takeChecks([user, { ...tenant, cost: 2 }], { request_id: 'm-1', headers: true });
  assert.equal(r.allowed, true);
  assert.deepEqual(r.checks.map((c) => [c.allowed, c.used, c.remaining]), [[true, 1, 4], [true, 2, 1]]);
  assert.equal(quotad.rateLimitHeaders(r)['RateLimit-Policy'], '"inline";q=5;w=2678400, "inline";q=3;w=1800');
  const again = await q.takeChecks([user, { ...tenant, cost: 2 }], { request_id: 'm-1' });
  assert.equal(again.replay, true);
  // The tenant has 1 token: denied, and the user's window is untouched.
  const denied = await q.takeChecks([user, { ...tenant, cost: 2 }]);
  assert.equal(denied.allowed, false);
  assert.deepEqual(denied.checks.map((c) => c.allowed), [true, false]);
  assert.ok(denied.retry_after_ms > 0);
  assert.equal((await q.peek(user.subject, { limit: 5, window_ms: 2678400000 })).used, 1);
  await assert.rejects(q.takeChecks([user], { request_id: 'm-1' }), quotad.Conflict);
  await assert.rejects(q.takeChecks([user, user]), quotad.Invalid);
  await assert.rejects(q.takeChecks(user), TypeError);
  await assert.rejects(q.takeChecks([user], { requestId: 'x' }), TypeError);
  await q.close();
});

test('unknown option names are a TypeError', async () => {
  const q = await quotad.Client.connect(SOCKET);
  const s = `${PREFIX}-kw`;
  const calls = [
    () => q.take(s, { limit: 5, window_ms: 60000, requestId: 'x' }),
    () => q.take(s, { algorithm: 'token_bucket', rate: 1, period_ms: 1000, brust: 3 }),
    () => q.peek(s, { limit: 5, window_ms: 60000, cost: 1 }),
    () => q.release(s, 'job-1', { window_ms: 1000 }),
    () => q.ping({ id: 1 }),
    () => q.take(s, { limit: 5, window_ms: 60000, timeoutMs: -1 }),
  ];
  for (const call of calls) await assert.rejects(call(), TypeError);
  assert.throws(() => new quotad.Client(SOCKET, { timeout: 1 }), TypeError);
  // None of them reached the sidecar.
  assert.equal((await q.peek(s, { limit: 5, window_ms: 60000 })).used, 0);
  await q.close();
});

test('connection errors and timeouts', async (t) => {
  await assert.rejects(quotad.Client.connect('/nonexistent/quotad.sock'), (err) => {
    assert.ok(err instanceof quotad.ConnectionError);
    assert.equal(err.code, 'CONNECTION');
    return true;
  });
  const closed = await quotad.Client.connect(SOCKET);
  await closed.close();
  await assert.rejects(closed.ping(), quotad.ConnectionError);

  const q = await quotad.Client.connect(await silentServer(t), { timeoutMs: 200 });
  await assert.rejects(q.ping(), (err) => err instanceof quotad.Timeout && err.code === 'TIMEOUT');
  await assert.rejects(q.take('x', { limit: 1, window_ms: 1000 }), (err) => err instanceof quotad.OutcomeUnknown && err.code === 'OUTCOME_UNKNOWN');
  await assert.rejects(q.take('x', { limit: 1, window_ms: 1000, request_id: 'r-1', timeoutMs: 100 }), quotad.Timeout);
  await q.close();
});
