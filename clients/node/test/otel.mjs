// The client sends the span active in @opentelemetry/api when the
// application has that package: run with @opentelemetry/api installed
// next to quotad (integration/clients_test.go installs it).
//
//   node --test otel.mjs

import assert from 'node:assert/strict';
import { AsyncLocalStorage } from 'node:async_hooks';
import { test } from 'node:test';

import { context, ROOT_CONTEXT, trace, TraceFlags } from '@opentelemetry/api';
import * as quotad from 'quotad';

import { recordingServer } from './recording.mjs';

// A context manager as the OpenTelemetry SDK's for Node, over
// AsyncLocalStorage: the API alone has none, and keeps no active span.
class StorageContextManager {
  #storage = new AsyncLocalStorage();
  active() { return this.#storage.getStore() ?? ROOT_CONTEXT; }
  with(ctx, fn, thisArg, ...args) { return this.#storage.run(ctx, () => fn.call(thisArg, ...args)); }
  bind(_ctx, target) { return target; }
  enable() { return this; }
  disable() { this.#storage.disable(); return this; }
}

test('a call sends the active span, and an option overrides it', async (t) => {
  assert.equal(context.setGlobalContextManager(new StorageContextManager()), true);
  t.after(() => context.disable());
  const srv = await recordingServer(t);
  const q = await quotad.Client.connect(srv.file);
  const inline = { limit: 1, window_ms: 1000 };
  const span = trace.wrapSpanContext({
    traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', traceFlags: TraceFlags.SAMPLED,
  });
  const given = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
  await context.with(trace.setSpan(context.active(), span), async () => {
    await q.take('s', inline);
    await q.takeChecks([{ subject: 's', ...inline }]);
    await q.take('s', { ...inline, traceparent: given });
    await q.take('s', { ...inline, traceparent: null });
  });
  await q.take('s', inline); // no active span
  await q.close();
  const active = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
  assert.deepEqual(srv.requests.map((r) => r.traceparent), [active, active, given, undefined, undefined]);
});
