// Minimal client for the quotad sidecar (protocol v1).
//
// Node 20+, no dependencies; copy this file into your project.
//
// The sidecar speaks newline-delimited JSON over a Unix stream socket: one
// request object per line, exactly one reply line per request, in request
// order on that connection. So replies are matched to requests first in,
// first out, and any number of requests may be in flight at once.
//
//   import { Client, QuotadError } from './quotad.mjs';
//
//   const q = await Client.connect('./quotad.sock');
//   const r = await q.take('user:42', { limit: 5, window_ms: 60000, request_id: 'order-1' });
//   if (!r.allowed) console.log(`retry in ${r.retry_after_ms} ms`);
//   await q.close();
//
// A denial resolves (allowed is false). An error reply ({"ok": false, ...})
// rejects with QuotadError. If the connection fails or closes, every
// outstanding request rejects and the client cannot be used again; connect
// a new one.

import net from 'node:net';

// Replies are small; a longer line means something is badly wrong.
const MAX_REPLY_LENGTH = 1 << 20;

// An error reply from the sidecar. code is e.g. 'CONFLICT', 'UNAVAILABLE',
// 'INVALID'; reply is the whole reply object. For UNAVAILABLE and
// SHUTTING_DOWN the outcome of a take is unknown: retry it with the same
// request_id.
export class QuotadError extends Error {
  constructor(code, message, reply) {
    super(`${code}: ${message}`);
    this.name = 'QuotadError';
    this.code = code;
    this.reply = reply;
  }
}

export class Client {
  // Connect to the sidecar's socket. With timeoutMs, the connection is
  // dropped (and outstanding requests reject) if a reply is awaited and the
  // socket stays silent that long. 0 means no timeout.
  static connect(path, { timeoutMs = 5000 } = {}) {
    return new Promise((resolve, reject) => {
      const socket = net.createConnection(path);
      const onError = (err) => reject(err);
      socket.once('error', onError);
      socket.once('connect', () => {
        socket.off('error', onError);
        resolve(new Client(socket, timeoutMs));
      });
    });
  }

  // Use Client.connect rather than calling this directly.
  constructor(socket, timeoutMs = 0) {
    this._socket = socket;
    this._pending = []; // {resolve, reject, raw} in request order
    this._buf = '';
    this._error = null; // set once the connection is unusable
    this._closing = false;

    socket.setEncoding('utf8'); // decodes UTF-8 split across chunks correctly
    socket.on('data', (chunk) => this._onData(chunk));
    socket.on('error', (err) => this._fail(err));
    socket.on('close', () => this._fail(new Error('quotad connection closed')));
    if (timeoutMs > 0) {
      socket.setTimeout(timeoutMs, () => {
        if (this._pending.length > 0) {
          this._fail(new Error(`quotad did not reply within ${timeoutMs} ms`));
        }
      });
    }
  }

  // Send one request object; resolves with its reply, or rejects with
  // QuotadError for an error reply.
  request(req) {
    return this._send([req], false)[0];
  }

  // Send all requests in one write. Resolves with the replies in request
  // order; error replies are included as they are (check reply.ok) rather
  // than rejected, so one failing request does not hide the others.
  pipeline(reqs) {
    return Promise.all(this._send(reqs, true));
  }

  // Consume cost units of subject's quota. Address the quota with
  // { policy } or inline with { limit, window_ms }; add request_id to make
  // retries safe (a retry returns the original answer with replay: true,
  // without consuming again). Other protocol fields (id, timeout_ms) pass
  // through, and so do the inline forms of the other algorithms:
  // { algorithm: 'token_bucket', rate, period_ms, burst } or
  // { algorithm: 'concurrency', limit, lease_ms } (a concurrency take needs a
  // request_id: it names the lease, and taking it again renews it).
  take(subject, { cost = 1, ...fields } = {}) {
    return this.request({ op: 'take', subject, cost, ...fields });
  }

  // Report subject's quota without consuming any.
  peek(subject, fields = {}) {
    return this.request({ op: 'peek', subject, ...fields });
  }

  // Check the sidecar and its store.
  // Free the concurrency lease request_id of subject, addressed as for take
  // (policy, or algorithm: 'concurrency' with limit and lease_ms). Resolves
  // to the reply; released is false when no such lease was held, which is not
  // an error, so a release is safe to retry.
  release(subject, request_id, fields = {}) {
    return this.request({ op: 'release', subject, request_id, ...fields });
  }

  ping(fields = {}) {
    return this.request({ op: 'ping', ...fields });
  }

  // Close the connection. Requests already sent still get their replies
  // (the socket closes after the last one); new requests reject.
  close() {
    this._closing = true;
    return new Promise((resolve) => {
      if (this._socket.destroyed) return resolve();
      this._socket.once('close', () => resolve());
      if (this._pending.length === 0) this._socket.destroy();
    });
  }

  // -- internals ----------------------------------------------------------

  _send(reqs, raw) {
    if (this._error || this._closing) {
      const err = this._error ?? new Error('quotad client is closed');
      return reqs.map(() => Promise.reject(err));
    }
    let data;
    try {
      // JSON.stringify escapes control characters, so a line holds no raw "\n".
      data = reqs.map((r) => JSON.stringify(r) + '\n').join('');
    } catch (err) {
      return reqs.map(() => Promise.reject(err));
    }
    const promises = reqs.map(
      () => new Promise((resolve, reject) => this._pending.push({ resolve, reject, raw })),
    );
    this._socket.write(data);
    return promises;
  }

  _onData(chunk) {
    this._buf += chunk;
    let nl;
    while ((nl = this._buf.indexOf('\n')) !== -1) {
      const line = this._buf.slice(0, nl);
      this._buf = this._buf.slice(nl + 1);
      if (!this._onLine(line)) return;
    }
    if (this._buf.length > MAX_REPLY_LENGTH) {
      this._fail(new Error('quotad reply line too long'));
    }
  }

  // Returns false if the connection had to be failed.
  _onLine(line) {
    const waiter = this._pending.shift();
    if (!waiter) {
      this._fail(new Error('quotad sent a reply nobody asked for'));
      return false;
    }
    let reply;
    try {
      reply = JSON.parse(line);
      if (reply === null || typeof reply !== 'object' || Array.isArray(reply)) {
        throw new Error('not a JSON object');
      }
    } catch (err) {
      // Order can no longer be trusted: give up on this connection.
      this._pending.unshift(waiter);
      this._fail(new Error(`quotad sent a bad reply (${err.message}): ${line.slice(0, 200)}`));
      return false;
    }
    if (reply.ok === false && !waiter.raw) {
      waiter.reject(new QuotadError(reply.error, reply.message ?? '', reply));
    } else {
      waiter.resolve(reply);
    }
    if (this._closing && this._pending.length === 0) this._socket.destroy();
    return true;
  }

  // Make the connection unusable and reject everything outstanding.
  _fail(err) {
    if (!this._error) this._error = err;
    const pending = this._pending;
    this._pending = [];
    for (const w of pending) w.reject(this._error);
    this._socket.destroy();
  }
}
