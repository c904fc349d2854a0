// Client for the quotad sidecar (protocol v1). Node 20+, no dependencies.
//
//   import { Client } from 'quotad';
//
//   const q = await Client.connect('./quotad.sock');
//   const r = await q.take('user:42', { limit: 5, window_ms: 60000, request_id: 'order-1' });
//   if (!r.allowed) console.log(`retry in ${r.retry_after_ms} ms`);
//   await q.close();
//
// One Client carries any number of concurrent calls over one connection;
// each request gets an id and its reply is matched by it (replies also come
// in request order, which the client checks). A denial resolves (allowed is
// false); an error reply rejects with the QuotadError subclass of its code.
//
// After a lost connection (the sidecar restarted, say) the client connects
// again by itself and resends what is safe to resend: pings, peeks,
// releases, settles and takes with a request_id. A take without a request_id that was
// written before the connection was lost rejects with OutcomeUnknown
// instead: it may or may not have been counted, and sending it again could
// count it twice.
//
// Every operation but ping carries the caller's W3C trace context, so that
// the decision joins the caller's trace: the traceparent (and tracestate)
// option, or else, when the application has @opentelemetry/api installed,
// the span active when the call is made. { traceparent: null } sends none.

import { createRequire } from 'node:module';
import net from 'node:net';
import { performance } from 'node:perf_hooks';

export const DEFAULT_SOCKET = '/run/quotad/quotad.sock';
// Milliseconds a call may take, connecting again included, unless told otherwise.
export const DEFAULT_TIMEOUT_MS = 5000;
// Replies are a few hundred bytes; a longer line means something is badly wrong.
const MAX_REPLY_LENGTH = 1 << 20;
// Attempts of one call across lost connections, and the pause between them
// (ms, doubling), so a sidecar that keeps failing is not hammered.
const MAX_ATTEMPTS = 50;
const BACKOFF_FIRST_MS = 10;
const BACKOFF_MAX_MS = 250;

// -- errors -----------------------------------------------------------------

// Base of every error this package rejects with. code is the protocol's
// error code ('CONFLICT', 'INVALID', ...) or one of this client's own:
// 'CONNECTION', 'TIMEOUT', 'OUTCOME_UNKNOWN'. message is for people and may
// change; reply is the sidecar's whole error reply, when there was one.
export class QuotadError extends Error {
  constructor(code, message, reply = null) {
    super(`${code}: ${message}`);
    this.name = new.target.name;
    this.code = code;
    this.message = message;
    this.reply = reply;
  }

  toString() {
    return `${this.name}: ${this.code}: ${this.message}`;
  }
}

// INVALID: the request is malformed or out of range; fix it.
export class Invalid extends QuotadError {}
// TOO_LARGE: the request line exceeded the sidecar's --max-line-bytes.
export class TooLarge extends QuotadError {}
// UNKNOWN_POLICY: no policy of that name in the sidecar's config.
export class UnknownPolicy extends QuotadError {}
// CONFLICT: the request_id was accepted with another cost; nothing changed.
export class Conflict extends QuotadError {}
// POLICY: inline limits differ from the live window's; nothing changed.
export class PolicyMismatch extends QuotadError {}
// WRONGTYPE: the subject's Redis key holds data quotad did not write.
export class WrongType extends QuotadError {}
// REQUEST_IDS_FULL: the window holds the most request ids it may.
export class RequestIdsFull extends QuotadError {}
// UNAVAILABLE: Redis did not decide; for a take the outcome is unknown
// unless the message says otherwise. Retry with the same request_id.
export class Unavailable extends QuotadError {}
// SHUTTING_DOWN: the sidecar is draining. The client retries resendable
// calls on a new connection itself; this is seen only when that ran out of time.
export class ShuttingDown extends QuotadError {}
// INTERNAL, and any code this client does not know (PROTOCOL.md says to
// treat those like INTERNAL); code holds the code as sent.
export class Internal extends QuotadError {}

// The sidecar could not be reached, or the connection failed in a way that
// resending could not repair.
export class ConnectionError extends QuotadError {
  constructor(message, code = 'CONNECTION') {
    super(code, message);
  }
}

// No reply within the call's timeout (for a call that was safe to resend,
// or that was never written).
export class Timeout extends ConnectionError {
  constructor(message) {
    super(message, 'TIMEOUT');
  }
}

// A take without a request_id was written, and then the connection was
// lost, the sidecar shut down, or the timeout passed before its reply. It
// may or may not have been counted; it was not sent again.
export class OutcomeUnknown extends QuotadError {
  constructor(message, reply = null) {
    super('OUTCOME_UNKNOWN', message, reply);
  }
}

const ERRORS_BY_CODE = {
  INVALID: Invalid,
  TOO_LARGE: TooLarge,
  UNKNOWN_POLICY: UnknownPolicy,
  CONFLICT: Conflict,
  POLICY: PolicyMismatch,
  WRONGTYPE: WrongType,
  REQUEST_IDS_FULL: RequestIdsFull,
  UNAVAILABLE: Unavailable,
  SHUTTING_DOWN: ShuttingDown,
  INTERNAL: Internal,
};

// The error for an error reply ({"ok": false, "error": ...}).
export function errorFromReply(reply) {
  const code = typeof reply.error === 'string' && reply.error !== '' ? reply.error : 'INTERNAL';
  const Cls = Object.hasOwn(ERRORS_BY_CODE, code) ? ERRORS_BY_CODE[code] : Internal;
  return new Cls(code, typeof reply.message === 'string' ? reply.message : '', reply);
}

// -- requests ---------------------------------------------------------------

const ADDRESS = ['policy', 'limit', 'window_ms', 'algorithm', 'rate', 'period_ms', 'burst', 'lease_ms', 'timeout_ms',
  'period', 'time_zone', 'week_start', 'jitter_ms'];
const TRACE = ['traceparent', 'tracestate'];
const OPTIONS = {
  take: [...ADDRESS, 'cost', 'request_id', 'headers', 'timeoutMs', ...TRACE],
  takeChecks: ['cost', 'request_id', 'timeout_ms', 'headers', 'timeoutMs', ...TRACE],
  peek: [...ADDRESS, 'headers', 'timeoutMs', ...TRACE],
  release: ['policy', 'limit', 'algorithm', 'lease_ms', 'timeout_ms', 'timeoutMs', ...TRACE],
  settle: [...ADDRESS.filter((f) => f !== 'lease_ms'), 'cost', 'request_id', 'headers', 'timeoutMs', ...TRACE],
  ping: ['timeoutMs'],
  call: ['timeoutMs'],
  client: ['timeoutMs'],
};

// Refuse option names this client does not know: a misspelled one
// ('brust', 'requestId') would otherwise be dropped without a word.
function checkOptions(what, options) {
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw new TypeError(`quotad: the options of ${what} must be an object`);
  }
  const known = OPTIONS[what];
  for (const name of Object.keys(options)) {
    if (!known.includes(name)) {
      throw new TypeError(`quotad: unknown option "${name}" for ${what}; known: ${known.join(', ')}`);
    }
  }
  const h = options.headers;
  if (h !== undefined && h !== null && typeof h !== 'boolean') {
    throw new TypeError(`quotad: headers must be true or false, not ${h}`);
  }
  const t = options.timeoutMs;
  if (t !== undefined && t !== null && !(Number.isFinite(t) && t > 0)) {
    throw new TypeError(`quotad: timeoutMs must be a positive number of milliseconds, not ${t}`);
  }
}

function buildRequest(op, fields) {
  const req = { op };
  for (const [k, v] of Object.entries(fields)) {
    // headers: false asks for nothing, so the request goes as without it.
    if (v !== undefined && v !== null && k !== 'timeoutMs' && !(k === 'headers' && v === false)) req[k] = v;
  }
  if (fields.traceparent === undefined) {
    const active = activeTraceContext();
    if (active !== undefined) Object.assign(req, active);
  }
  return req;
}

// otelApi is @opentelemetry/api when the application has it installed,
// null when it has not; looked up once, at the first call. It is not a
// dependency: a client without it sends no trace context of its own.
let otelApi;

function loadOtelApi() {
  if (otelApi === undefined) {
    try {
      otelApi = createRequire(import.meta.url)('@opentelemetry/api');
    } catch {
      otelApi = null;
    }
  }
  return otelApi;
}

// The W3C trace context of the span active now, as request fields;
// undefined when there is none (or no @opentelemetry/api).
function activeTraceContext() {
  const api = loadOtelApi();
  if (api === null || typeof api.trace?.getSpanContext !== 'function') return undefined;
  try {
    const sc = api.trace.getSpanContext(api.context.active());
    if (sc === undefined || !api.trace.isSpanContextValid(sc)) return undefined;
    const flags = (sc.traceFlags & 0xff).toString(16).padStart(2, '0');
    const fields = { traceparent: `00-${sc.traceId}-${sc.spanId}-${flags}` };
    const state = sc.traceState?.serialize();
    if (state) fields.tracestate = state;
    return fields;
  } catch {
    // A tracing problem never costs a decision.
    return undefined;
  }
}

// The HTTP header fields of a take or peek reply asked with { headers: true },
// as a new object to merge into a response's headers: RateLimit-Policy,
// RateLimit and, on a denial, Retry-After. Empty when the reply has none (the
// request did not ask, or it is not a take or peek); nothing is computed
// here, the sidecar renders every value.
export function rateLimitHeaders(reply) {
  const h = reply !== null && typeof reply === 'object' ? reply.headers : undefined;
  if (h === null || typeof h !== 'object' || Array.isArray(h)) return {};
  return Object.fromEntries(Object.entries(h).map(([k, v]) => [k, String(v)]));
}

const LOST = Symbol('lost'); // an entry's result: the connection failed first
const PENDING = Symbol('pending'); // no result before the deadline

// One request of a call and what became of it.
class Call {
  constructor(req) {
    if (req === null || typeof req !== 'object' || Array.isArray(req)) {
      throw new TypeError('quotad: a request is an object');
    }
    const { id, ...rest } = req;
    this.req = rest;
    this.userId = id;
    // Sending it twice has the effect of sending it once: every op but a
    // take without a request_id.
    this.resendable = rest.op !== 'take' || (rest.request_id !== undefined && rest.request_id !== null);
    this.id = 0;
    this.line = '';
    this.written = false;
    this.reply = null;
    this.error = null;
  }

  // A fresh id (replies are matched by it) and the encoded line; a resent
  // request gets a new id on the new connection.
  encode(id) {
    this.id = id;
    // JSON.stringify escapes control characters: the line holds no raw "\n".
    this.line = JSON.stringify({ ...this.req, id }) + '\n';
    this.written = false;
  }

  // Record reply; false when the connection should carry nothing new (the
  // sidecar is shutting down).
  settle(reply, retry) {
    if (reply.ok === false && reply.error === 'SHUTTING_DOWN') {
      if (this.resendable) retry.push(this);
      else {
        this.error = new OutcomeUnknown(
          'quotad was shutting down and may have cut off this take; it was not sent again ' +
            '(give takes a request_id to have them resent)',
          reply,
        );
      }
      return false;
    }
    this.reply = reply;
    return true;
  }

  lost(why, retry) {
    if (this.resendable || !this.written) retry.push(this);
    else {
      this.error = new OutcomeUnknown(
        `connection to quotad lost after the take was sent (${why}); ` +
          'it may or may not have been counted, and was not sent again',
      );
    }
  }

  timedOut(timeoutMs) {
    this.error =
      this.written && !this.resendable
        ? new OutcomeUnknown(
            `no reply from quotad within ${timeoutMs} ms to a take without request_id; ` +
              'it may or may not have been counted',
          )
        : new Timeout(`no reply from quotad within ${timeoutMs} ms`);
  }

  // The reply as the caller sees it: with the caller's own id, if any.
  result() {
    if (this.error) return { ok: false, error: this.error.code, message: this.error.message };
    const { id, ...reply } = this.reply;
    return this.userId === undefined ? reply : { id: this.userId, ...reply };
  }

  // The reply, or its error thrown.
  unwrap() {
    if (this.error) throw this.error;
    const reply = this.result();
    if (reply.ok === false) throw errorFromReply(reply);
    return reply;
  }
}

function backoff(attempt) {
  return Math.min(BACKOFF_MAX_MS, BACKOFF_FIRST_MS * 2 ** Math.min(attempt, 10));
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function left(deadline) {
  return deadline === null ? Infinity : deadline - performance.now();
}

// Resolves with each promise's value, or PENDING for those unsettled at the
// deadline. The promises never reject.
function settleBy(promises, deadline) {
  const results = promises.map(() => PENDING);
  const all = Promise.all(promises.map((p, i) => p.then((v) => (results[i] = v))));
  if (deadline === null) return all.then(() => results);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(results), Math.max(0, left(deadline)));
    all.then(() => {
      clearTimeout(timer);
      resolve(results);
    });
  });
}

// -- connection -------------------------------------------------------------

// One socket shared by every call. Replies are handed to the waiting
// requests in order, and each reply's id must be the one expected.
class Conn {
  constructor(socket) {
    this.socket = socket;
    this.waiting = []; // {id, resolve}, in the order written
    this.head = 0;
    this.buf = '';
    this.failure = null; // why the connection is unusable, once it is
    this.retired = false; // the sidecar is draining: send nothing new
    socket.setEncoding('utf8'); // decodes UTF-8 split across chunks correctly
    socket.on('data', (chunk) => this.onData(chunk));
    socket.on('error', (err) => this.fail(err.message || String(err)));
    socket.on('end', () => this.fail('quotad closed the connection'));
    socket.on('close', () => this.fail('quotad closed the connection'));
  }

  usable() {
    return this.failure === null && !this.retired;
  }

  // Queue calls and write them in one write, so the order on the wire is
  // the order of this.waiting.
  send(calls) {
    if (this.socket.destroyed || !this.socket.writable) {
      // Lost before the events said so: nothing is written, so every call
      // may go on the next connection.
      this.fail(this.failure ?? 'quotad closed the connection');
      return calls.map(() => Promise.resolve(LOST));
    }
    const promises = calls.map((c) => new Promise((resolve) => this.waiting.push({ id: c.id, resolve })));
    this.socket.write(calls.map((c) => c.line).join(''));
    for (const c of calls) c.written = true;
    return promises;
  }

  onData(chunk) {
    this.buf += chunk;
    let nl;
    while ((nl = this.buf.indexOf('\n')) !== -1) {
      const line = this.buf.slice(0, nl);
      this.buf = this.buf.slice(nl + 1);
      if (!this.onLine(line)) return;
    }
    if (this.buf.length > MAX_REPLY_LENGTH) this.fail('quotad reply line too long');
  }

  // false once the connection had to be failed.
  onLine(line) {
    if (this.head >= this.waiting.length) {
      this.fail('quotad sent a reply nobody asked for');
      return false;
    }
    const entry = this.waiting[this.head];
    let reply;
    try {
      reply = JSON.parse(line);
    } catch (err) {
      this.fail(`quotad sent a reply that is not JSON (${err.message}): ${line.slice(0, 200)}`);
      return false;
    }
    if (reply === null || typeof reply !== 'object' || Array.isArray(reply)) {
      this.fail(`quotad sent a reply that is not a JSON object: ${line.slice(0, 200)}`);
      return false;
    }
    // A reply without an id answers a line the sidecar could not parse
    // (TOO_LARGE); replies come in request order, so it is this one's.
    if ('id' in reply && reply.id !== entry.id) {
      this.fail(`quotad answered request ${JSON.stringify(reply.id)} where ${entry.id} was expected`);
      return false;
    }
    this.waiting[this.head++] = undefined;
    if (this.head > 1024 && this.head * 2 > this.waiting.length) {
      this.waiting = this.waiting.slice(this.head);
      this.head = 0;
    }
    entry.resolve(reply);
    return true;
  }

  fail(why) {
    if (this.failure === null) this.failure = why;
    const waiting = this.waiting.slice(this.head);
    this.waiting = [];
    this.head = 0;
    for (const entry of waiting) entry.resolve(LOST);
    this.socket.destroy();
  }

  idle() {
    return this.head >= this.waiting.length;
  }
}

function dial(path, ms) {
  return new Promise((resolve, reject) => {
    const socket = net.createConnection(path);
    const timer =
      ms === Infinity
        ? null
        : setTimeout(() => {
            socket.destroy();
            reject(new Error('timed out'));
          }, Math.max(0, ms));
    socket.once('error', (err) => {
      if (timer) clearTimeout(timer);
      reject(err);
    });
    socket.once('connect', () => {
      if (timer) clearTimeout(timer);
      socket.removeAllListeners('error');
      resolve(socket);
    });
  });
}

// -- client -----------------------------------------------------------------

export class Client {
  // A client of the sidecar at path; it connects on first use (or use
  // Client.connect to connect at once). timeoutMs bounds each call,
  // connecting again and resending included; 0 or null means no limit.
  constructor(path = DEFAULT_SOCKET, options = {}) {
    checkOptions('client', options);
    this._path = path;
    this._timeoutMs = options.timeoutMs === undefined ? DEFAULT_TIMEOUT_MS : options.timeoutMs;
    this._conn = null;
    this._connecting = null;
    this._closed = false;
    this._nextId = 1;
    this._connections = 0;
    this._old = [];
    // Set once a connection was lost: the next connection waits for a
    // sidecar that reaches Redis before carrying calls.
    this._lost = false;
  }

  // Connect now; rejects with ConnectionError if the socket does not answer.
  static async connect(path = DEFAULT_SOCKET, options = {}) {
    const c = new Client(path, options);
    await c._connection(c._deadline(undefined), false);
    return c;
  }

  // Connections opened after the first one.
  get reconnects() {
    return Math.max(0, this._connections - 1);
  }

  // Consume cost units of subject's quota. Address the quota with { policy },
  // or inline: { limit, window_ms } (fixed window); { algorithm:
  // 'token_bucket', rate, period_ms, burst }; { algorithm: 'concurrency',
  // limit, lease_ms } (its take needs a request_id: it names the lease);
  // { algorithm: 'sliding_window', limit, window_ms }; { algorithm: 'calendar',
  // limit, period, time_zone, week_start, jitter_ms } (period 'minute' to
  // 'month'; time_zone default 'UTC'). A
  // request_id makes the take safe to retry, and lets the client resend it
  // after a lost connection. timeout_ms shortens the sidecar's Redis
  // deadline; timeoutMs bounds this call here. { headers: true } adds the
  // reply's RateLimit header fields (see rateLimitHeaders).
  async take(subject, options = {}) {
    checkOptions('take', options);
    const { cost = 1, ...rest } = options;
    return this._one(buildRequest('take', { subject, ...rest, cost }), options.timeoutMs);
  }

  // Take several limits at once, all or nothing: checks is an array of 1 to
  // 8 objects, each addressed as for take ({ policy, subject }, or inline
  // limits and subject) with an optional cost of its own. Either every check
  // consumes or none does; reply.allowed is the take's verdict and
  // reply.checks each check's decision, in order. The options are the take's:
  // its cost (default 1), request_id (replays every check; another set of
  // checks or costs under it is Conflict), timeout_ms, headers, timeoutMs.
  async takeChecks(checks, options = {}) {
    checkOptions('takeChecks', options);
    if (!Array.isArray(checks) || checks.some((c) => c === null || typeof c !== 'object' || Array.isArray(c))) {
      throw new TypeError('quotad: the checks of takeChecks must be an array of objects');
    }
    const { cost = 1, ...rest } = options;
    return this._one(buildRequest('take', { checks: checks.map((c) => ({ ...c })), ...rest, cost }), options.timeoutMs);
  }

  // Report subject's quota without consuming any (addressed as for take).
  async peek(subject, options = {}) {
    checkOptions('peek', options);
    return this._one(buildRequest('peek', { subject, ...options }), options.timeoutMs);
  }

  // Free the concurrency lease request_id of subject, addressed as for take.
  // released is false when no such lease was held, which is not an error: a
  // release is safe to retry.
  async release(subject, request_id, options = {}) {
    checkOptions('release', options);
    return this._one(buildRequest('release', { subject, request_id, ...options }), options.timeoutMs);
  }

  // Give the actual cost of the accepted take options.request_id of
  // subject, addressed as that take was: { request_id, cost, ...address }.
  // Lower than reserved gives the rest back, 0 gives it all back (a refund),
  // higher consumes the extra even past the limit. The same settle again is a
  // replay; another cost rejects with Conflict. settled is false when the
  // state no longer holds the take (its window ended) or never did: nothing
  // changed, which is not an error. A settle is safe to retry.
  async settle(subject, options = {}) {
    checkOptions('settle', options);
    if (typeof options.request_id !== 'string' || options.request_id === '') {
      throw new TypeError('quotad: settle needs the request_id of the take it settles');
    }
    if (!Number.isInteger(options.cost)) {
      throw new TypeError(`quotad: settle needs the take's actual cost, an integer, not ${options.cost}`);
    }
    return this._one(buildRequest('settle', { subject, ...options }), options.timeoutMs);
  }

  // Check the sidecar and its store.
  async ping(options = {}) {
    checkOptions('ping', options);
    return this._one({ op: 'ping' }, options.timeoutMs);
  }

  // Send one raw request object; resolves with its reply or rejects with its error.
  async request(req, options = {}) {
    checkOptions('call', options);
    return this._one(req, options.timeoutMs);
  }

  // Send many raw request objects in one write; resolves with the replies
  // in request order. Error replies are included as they are (check
  // reply.ok) rather than rejected, and so is a take whose outcome is
  // unknown (error 'OUTCOME_UNKNOWN'). A request's own id is given back in
  // its reply. Rejects with ConnectionError if the sidecar cannot be reached.
  async pipeline(reqs, options = {}) {
    checkOptions('call', options);
    const calls = [...reqs].map((r) => new Call(r));
    await this._run(calls, options.timeoutMs);
    const broken = calls.find((c) => c.error instanceof ConnectionError);
    if (broken) throw broken.error;
    return calls.map((c) => c.result());
  }

  // Close the connection; calls still waiting reject with ConnectionError
  // (or OutcomeUnknown for a take without request_id already sent).
  async close() {
    this._closed = true;
    const conns = [...this._old, ...(this._conn ? [this._conn] : [])];
    this._conn = null;
    this._old = [];
    await Promise.all(
      conns.map(
        (conn) =>
          new Promise((resolve) => {
            if (conn.socket.destroyed) return resolve();
            conn.socket.once('close', () => resolve());
            conn.fail('quotad client is closed');
          }),
      ),
    );
  }

  // -- internals ------------------------------------------------------------

  _deadline(timeoutMs) {
    const t = timeoutMs ?? this._timeoutMs;
    return t ? performance.now() + t : null;
  }

  async _one(req, timeoutMs) {
    const call = new Call(req);
    await this._run([call], timeoutMs);
    return call.unwrap();
  }

  async _run(calls, timeoutMs) {
    const timeout = timeoutMs ?? this._timeoutMs;
    const deadline = this._deadline(timeoutMs);
    let todo = calls;
    let last = '';
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
      if (todo.length === 0) return;
      if (attempt > 0) await sleep(Math.min(backoff(attempt), Math.max(0, left(deadline))));
      let conn;
      try {
        conn = await this._connection(deadline, true);
      } catch (err) {
        if (!(err instanceof QuotadError)) throw err;
        for (const c of todo) c.error = err;
        return;
      }
      for (const c of todo) c.encode(this._nextId++);
      const results = await settleBy(conn.send(todo), deadline);
      const retry = [];
      todo.forEach((c, i) => {
        const r = results[i];
        if (r === PENDING) c.timedOut(timeout);
        else if (r === LOST) {
          last = conn.failure ?? 'connection lost';
          this._lost = true;
          c.lost(last, retry);
        } else if (!c.settle(r, retry)) {
          conn.retired = true;
          this._lost = true;
        }
      });
      todo = retry;
    }
    for (const c of todo) {
      c.error = new ConnectionError(`quotad connection kept failing (${last}); gave up after ${MAX_ATTEMPTS} attempts`);
    }
  }

  // The connection to send on, opened (again) if need be; concurrent
  // callers share one attempt.
  async _connection(deadline, retry) {
    for (;;) {
      if (this._closed) throw new ConnectionError('quotad client is closed');
      if (this._conn && this._conn.usable()) return this._conn;
      if (!this._connecting) {
        this._connecting = this._open(deadline, retry).finally(() => {
          this._connecting = null;
        });
      }
      try {
        await this._connecting;
      } catch (err) {
        // Another caller's attempt may have had a shorter deadline.
        if (left(deadline) <= 0 || !retry || this._closed) throw err;
      }
    }
  }

  // Ping until the sidecar says it reaches Redis. A sidecar that just
  // started answers UNAVAILABLE (not run) until then; the calls being resent
  // should wait for it rather than fail. Once the deadline is near, they go
  // anyway and get the sidecar's own answer.
  async _awaitReady(conn, deadline) {
    for (let attempt = 1; conn.usable(); attempt++) {
      const ping = new Call({ op: 'ping' });
      ping.encode(this._nextId++);
      const [r] = await settleBy(conn.send([ping]), deadline);
      if (r === PENDING || r === LOST) return;
      if (r.redis_ok === true) {
        this._lost = false;
        return;
      }
      if (r.error === 'SHUTTING_DOWN') {
        conn.retired = true;
        return;
      }
      if (attempt >= MAX_ATTEMPTS || left(deadline) <= backoff(attempt)) return;
      await sleep(backoff(attempt));
    }
  }

  async _open(deadline, retry) {
    const old = this._conn;
    this._conn = null;
    if (old) {
      // A draining connection still reads the replies it is owed.
      if (old.failure === null && !old.idle()) this._old.push(old);
      else old.fail('replaced');
    }
    this._old = this._old.filter((c) => c.failure === null);
    for (let attempt = 1; ; attempt++) {
      try {
        const ms = left(deadline);
        if (ms <= 0) throw new Error('timed out');
        const socket = await dial(this._path, ms);
        if (this._closed) {
          socket.destroy();
          throw new ConnectionError('quotad client is closed');
        }
        const fresh = new Conn(socket);
        this._connections++;
        if (this._lost) await this._awaitReady(fresh, deadline);
        this._conn = fresh;
        return;
      } catch (err) {
        if (err instanceof QuotadError) throw err;
        const ms = left(deadline);
        if (!retry || ms <= 0 || attempt >= MAX_ATTEMPTS * 4) {
          const e = new ConnectionError(`cannot connect to quotad at ${this._path}: ${err.message}`);
          e.cause = err;
          throw e;
        }
        await sleep(Math.min(backoff(attempt), ms));
      }
    }
  }
}
