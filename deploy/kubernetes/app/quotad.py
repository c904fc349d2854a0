"""Minimal client for the quotad sidecar (protocol v1).

Standard library only; copy this file into your project.

The sidecar speaks newline-delimited JSON over a Unix stream socket: one
request object per line, exactly one reply line per request, in request
order on that connection.

    from quotad import Client, QuotadError

    with Client("./quotad.sock") as q:
        r = q.take("user:42", limit=5, window_ms=60000, request_id="order-1")
        if r["allowed"]:
            ...                      # proceed
        else:
            wait = r["retry_after_ms"]

A denial is a normal reply (allowed is False). An error reply
({"ok": false, ...}) raises QuotadError.

A Client is one connection and is not thread-safe: share it only behind a
lock, or give each thread its own. If a read or write fails (timeout,
reset, garbled reply) the client closes itself, because replies are
matched to requests by order alone and that order can no longer be
trusted; make a new Client to carry on.
"""

import json
import socket

__all__ = ["Client", "QuotadError"]

# Replies are small; a longer line means something is badly wrong.
MAX_REPLY_BYTES = 1 << 20

# Requests written per send in pipeline(); small enough that a chunk and its
# replies always fit in the socket buffers.
PIPELINE_CHUNK = 256


class QuotadError(Exception):
    """An error reply from the sidecar.

    code    -- e.g. "CONFLICT", "UNAVAILABLE", "INVALID" (see the protocol)
    message -- human-readable detail
    reply   -- the whole reply dict

    For UNAVAILABLE and SHUTTING_DOWN the outcome of a take is unknown:
    retry it with the same request_id.
    """

    def __init__(self, code, message, reply):
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message
        self.reply = reply


class Client:
    def __init__(self, path, timeout=5.0):
        """Connect to the sidecar's socket at path.

        timeout (seconds, or None for no limit) bounds each connect, send
        and receive on the socket.
        """
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(timeout)
            self._sock.connect(path)
        except BaseException:
            self._sock.close()
            raise
        # Buffered reader: handles replies split over several recv() calls
        # and several replies arriving in one.
        self._reader = self._sock.makefile("rb")
        self._closed = False

    # -- connection -------------------------------------------------------

    def close(self):
        if not self._closed:
            self._closed = True
            self._reader.close()
            self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- raw protocol -----------------------------------------------------

    def request(self, req):
        """Send one request dict and return its reply dict.

        Raises QuotadError if the reply is an error reply.
        """
        reply = self.pipeline([req])[0]
        if reply.get("ok") is False:
            raise QuotadError(reply.get("error"), reply.get("message", ""), reply)
        return reply

    def pipeline(self, reqs):
        """Send many requests without waiting for each reply.

        Returns the replies in request order. Error replies are returned
        as they are (check reply["ok"]) rather than raised, so one failing
        request does not hide the answers to the others.

        Requests go out in chunks of PIPELINE_CHUNK lines, each written in
        one send and then read back. Writing a huge batch before reading
        anything would deadlock: once the socket buffers fill, the sidecar
        stops reading until its replies are read.
        """
        self._check_open()
        replies = []
        try:
            for i in range(0, len(reqs), PIPELINE_CHUNK):
                chunk = reqs[i:i + PIPELINE_CHUNK]
                self._sock.sendall(b"".join(_encode(r) for r in chunk))
                replies.extend(self._read_reply() for _ in chunk)
            return replies
        except BaseException:
            self.close()
            raise

    # -- operations -------------------------------------------------------

    def take(self, subject, policy=None, limit=None, window_ms=None, cost=1,
             request_id=None, **extra):
        """Consume cost units of subject's quota.

        Address the quota either by a named policy, or inline by limit and
        window_ms. Pass request_id to make retries safe: a retry with the
        same id returns the original answer (with "replay": true) without
        consuming again. Other protocol fields (id, timeout_ms) go in extra,
        and so do the inline forms of the other algorithms:
        algorithm="token_bucket", rate=10, period_ms=1000, burst=20, or
        algorithm="concurrency", limit=2, lease_ms=30000 (a concurrency take
        needs a request_id: it names the lease, and taking it again renews it).
        """
        return self.request(_build("take", subject=subject, policy=policy,
                                   limit=limit, window_ms=window_ms,
                                   cost=cost, request_id=request_id, **extra))

    def peek(self, subject, policy=None, limit=None, window_ms=None, **extra):
        """Report subject's quota without consuming any."""
        return self.request(_build("peek", subject=subject, policy=policy,
                                   limit=limit, window_ms=window_ms, **extra))

    def release(self, subject, request_id, policy=None, **extra):
        """Free the concurrency lease request_id of subject.

        Address the subject as for take: a policy, or inline
        algorithm="concurrency", limit=..., lease_ms=... in extra. Returns
        the reply; reply["released"] is False when no such lease was held,
        which is not an error, so a release is safe to retry.
        """
        return self.request(_build("release", subject=subject, policy=policy,
                                   request_id=request_id, **extra))

    def ping(self, **extra):
        """Check the sidecar and its store."""
        return self.request(_build("ping", **extra))

    # -- internals --------------------------------------------------------

    def _check_open(self):
        if self._closed:
            raise ConnectionError("quotad client is closed")

    def _read_reply(self):
        line = self._reader.readline(MAX_REPLY_BYTES + 1)
        if not line.endswith(b"\n"):
            if not line:
                raise ConnectionError("quotad closed the connection")
            if len(line) > MAX_REPLY_BYTES:
                raise ConnectionError("quotad reply line too long")
            raise ConnectionError("quotad closed the connection mid-reply")
        try:
            reply = json.loads(line)
        except ValueError as e:
            raise ValueError("quotad sent a bad reply (%s): %r" % (e, line[:200]))
        if not isinstance(reply, dict):
            raise ValueError("quotad reply is not a JSON object: %r" % line[:200])
        return reply


def _build(op, **fields):
    """A request dict with the fields that were given (None means absent)."""
    req = {"op": op}
    req.update((k, v) for k, v in fields.items() if v is not None)
    return req


def _encode(req):
    # json.dumps escapes control characters, so the line holds no raw "\n".
    return json.dumps(req, separators=(",", ":"), allow_nan=False).encode("utf-8") + b"\n"
