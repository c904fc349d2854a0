// Compiled with tsc --noEmit --strict by the tests: the declarations must
// describe the API as the README uses it.
import { Client, Conflict, OutcomeUnknown, QuotadError, rateLimitHeaders, type CheckReply, type MultiTakeReply, type SettleReply, type TakeReply } from 'quotad';

async function main(): Promise<void> {
  const q: Client = await Client.connect('./quotad.sock', { timeoutMs: 2000 });
  const r: TakeReply = await q.take('alice', { limit: 5, window_ms: 60000, cost: 2, request_id: 'order-1' });
  const used: number = r.used;
  const lease: number | undefined = r.lease_ms;
  const p = await q.peek('alice', { limit: 5, window_ms: 60000, timeoutMs: 100 });
  const sw: TakeReply = await q.take('carol', { algorithm: 'sliding_window', limit: 100, window_ms: 60000 });
  const h: Record<string, string> = rateLimitHeaders(await q.take('alice', { policy: 'api', headers: true }));
  const policyField: string | undefined = (await q.peek('alice', { policy: 'api', headers: true })).headers?.['RateLimit-Policy'];
  console.log(h, policyField);
  const multi: MultiTakeReply = await q.takeChecks(
    [{ policy: 'per-user', subject: 'user:42' }, { policy: 'per-tenant', subject: 'tenant:7', cost: 5 }],
    { request_id: 'req-1', headers: true });
  const denying: number[] = multi.checks.flatMap((c: CheckReply, i) => (c.allowed ? [] : [i]));
  console.log(multi.allowed, denying, rateLimitHeaders(multi));
  const daily: TakeReply = await q.take('alice', { algorithm: 'calendar', limit: 1000, period: 'day', time_zone: 'Asia/Shanghai' });
  const weekly = await q.peek('alice', { algorithm: 'calendar', limit: 9, period: 'week', week_start: 'sunday', jitter_ms: 60000 });
  const resets: number = daily.reset_ms + weekly.reset_ms;
  const rel = await q.release('jobs', 'job-1', { algorithm: 'concurrency', limit: 2, lease_ms: 30000 });
  const released: boolean = rel.released;
  const s: SettleReply = await q.settle('alice', { limit: 5, window_ms: 60000, request_id: 'order-1', cost: 1 });
  const settled: boolean = s.settled && !s.replay && s.reserved > 0;
  console.log(settled, rateLimitHeaders(s));
  // @ts-expect-error a settle needs the take's cost
  await q.settle('alice', { limit: 5, window_ms: 60000, request_id: 'order-1' });
  const traced: TakeReply = await q.take('alice', {
    policy: 'api', traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', tracestate: 'vendor=x' });
  await q.takeChecks([{ policy: 'api', subject: 'alice' }], { traceparent: null });
  console.log(traced.allowed);
  const ping = await q.ping();
  const ready: boolean = ping.ready;
  const replies = await q.pipeline([{ op: 'take', id: 'a', subject: 'bob', limit: 1, window_ms: 1000 }]);
  const ok: boolean = replies[0].ok;
  try {
    await q.take('alice', { policy: 'api' });
  } catch (err) {
    if (err instanceof Conflict || err instanceof OutcomeUnknown) {
      const code: string = err.code;
      console.log(code);
    } else if (err instanceof QuotadError) {
      console.log(err.code, err.message, err.reply?.error);
    }
  }
  // @ts-expect-error a misspelled option is a type error too
  await q.take('alice', { limit: 5, window_ms: 60000, brust: 3 });
  console.log(used, lease, p.remaining, sw.used, released, ready, ok, q.reconnects);
  await q.close();
}

void main();
