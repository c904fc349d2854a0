"""Client for the quotad sidecar (protocol v1), standard library only.

    from quotad import Client

    with Client("./quotad.sock") as q:
        r = q.take("user:42", limit=5, window_ms=60000, request_id="order-1")
        if not r["allowed"]:
            print("retry in", r["retry_after_ms"], "ms")

`Client` is for threads: one object may be shared by any number of them.
It keeps a small pool of connections and gives each call one connection to
itself, so every call reads its own reply. `AsyncClient` is the same API
for asyncio (`await q.take(...)`): any number of tasks share one
connection, and replies are matched to requests by the protocol's `id`.

A denial is a normal reply (`allowed` is False). An error reply raises the
`QuotadError` subclass of its code (`Conflict`, `Invalid`, ...); a failure
to reach the sidecar raises `quotad.ConnectionError` (or `Timeout`).

After a lost connection (the sidecar restarted, say) both clients connect
again by themselves and resend what is safe to resend: pings, peeks,
releases, settles and takes with a `request_id`. A take without a `request_id` that
was written before the connection was lost raises `OutcomeUnknown` instead:
it may or may not have been counted, and sending it again could count it
twice.

Every operation but ping takes `traceparent` (and `tracestate`): the
caller's W3C trace context, the value of the header of that name (with
OpenTelemetry: `opentelemetry.propagate.inject(carrier)` then
`carrier["traceparent"]`), so that the decision joins the caller's trace.
The sidecar ignores an invalid one; it never changes the reply.

The whole package is this one file, so it can also be shipped as a single
`quotad.py` next to an application.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import itertools
import json
import socket
import threading
import time
from typing import (
    Any,
    Deque,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Type,
    TypedDict,
    cast,
)

__version__ = "1.0.0"

__all__ = [
    "AsyncClient",
    "Check",
    "CheckReply",
    "Client",
    "ConnectionError",
    "Conflict",
    "Internal",
    "Invalid",
    "MultiTakeReply",
    "OutcomeUnknown",
    "PeekReply",
    "PingReply",
    "PolicyMismatch",
    "QuotadError",
    "RateLimitHeaders",
    "ReleaseReply",
    "Reply",
    "RequestIdsFull",
    "SettleReply",
    "ShuttingDown",
    "TakeReply",
    "Timeout",
    "TooLarge",
    "Unavailable",
    "UnknownPolicy",
    "WrongType",
    "rate_limit_headers",
]

DEFAULT_SOCKET = "/run/quotad/quotad.sock"
# Seconds a call may take, connecting again included, unless told otherwise.
DEFAULT_TIMEOUT = 5.0
# Connections a Client opens at most; more threads wait for a free one.
DEFAULT_MAX_CONNECTIONS = 8
# Replies are a few hundred bytes; a longer line means something is badly wrong.
MAX_REPLY_BYTES = 1 << 20
# Requests written per send by Client.pipeline: a chunk and its replies
# always fit in the socket buffers, so writing never waits on reading.
PIPELINE_CHUNK = 256
# Attempts of one call across lost connections, and the pause between
# them (seconds, doubling), so a sidecar that keeps failing is not hammered.
_MAX_ATTEMPTS = 50
_BACKOFF_FIRST = 0.01
_BACKOFF_MAX = 0.25

Reply = Dict[str, Any]


# The IETF RateLimit header fields of a take or peek asked with
# headers=True, by field name: values to copy into an HTTP response as they
# are. "RateLimit" is absent from a degraded answer, "Retry-After" from all
# but a denied take.
RateLimitHeaders = TypedDict("RateLimitHeaders", {
    "RateLimit-Policy": str,
    "RateLimit": str,
    "Retry-After": str,
}, total=False)


class _TakeFields(TypedDict):
    ok: bool
    allowed: bool
    replay: bool
    limit: int
    used: int
    remaining: int
    reset_ms: int
    retry_after_ms: int


class TakeReply(_TakeFields, total=False):
    """The reply to a take. Optional fields appear as PROTOCOL.md says."""

    lease_ms: int
    shadow: bool
    shadow_allowed: bool
    degraded: bool
    local: bool
    headers: RateLimitHeaders


class _PeekFields(TypedDict):
    ok: bool
    limit: int
    used: int
    remaining: int
    reset_ms: int


class PeekReply(_PeekFields, total=False):
    """The reply to a peek; headers only when asked for."""

    headers: RateLimitHeaders


class ReleaseReply(TypedDict):
    ok: bool
    released: bool
    limit: int
    used: int
    remaining: int


class _SettleFields(TypedDict):
    ok: bool
    settled: bool
    replay: bool
    reserved: int
    limit: int
    used: int
    remaining: int
    reset_ms: int
    retry_after_ms: int


class SettleReply(_SettleFields, total=False):
    """The reply to a settle: settled is False when the state holds no take
    of that request_id (its window ended, say), which is not an error."""

    headers: RateLimitHeaders


class _PingFields(TypedDict):
    ok: bool
    store: str
    redis_ok: bool
    version: str
    ready: bool


class PingReply(_PingFields, total=False):
    redis_error: str


class _CheckAddress(TypedDict):
    subject: str


class Check(_CheckAddress, total=False):
    """One limit of a take of several (take_checks): addressed as for take,
    by policy or inline limits, with an optional cost of its own."""

    policy: str
    limit: int
    window_ms: int
    algorithm: str
    rate: int
    period_ms: int
    burst: int
    lease_ms: int
    period: str
    time_zone: str
    week_start: str
    jitter_ms: int
    cost: int


class _CheckFields(TypedDict):
    allowed: bool
    replay: bool
    limit: int
    used: int
    remaining: int
    reset_ms: int
    retry_after_ms: int


class CheckReply(_CheckFields, total=False):
    """One check's decision. In a denied take, a check with room says
    allowed and consumed nothing; skipped: the local denial answered the
    take without asking about this check."""

    lease_ms: int
    shadow: bool
    shadow_allowed: bool
    degraded: bool
    skipped: bool


class _MultiTakeFields(TypedDict):
    ok: bool
    allowed: bool
    replay: bool
    retry_after_ms: int
    checks: List[CheckReply]


class MultiTakeReply(_MultiTakeFields, total=False):
    """The reply to a take of several limits: allowed when every check
    consumed, none having otherwise; checks in the request's order."""

    degraded: bool
    headers: RateLimitHeaders


def _checks_request(checks: Sequence[Mapping[str, Any]], cost: int, request_id: Optional[str],
                    timeout_ms: Optional[int], headers: bool, traceparent: Optional[str],
                    tracestate: Optional[str]) -> Reply:
    if isinstance(checks, (str, bytes)) or not isinstance(checks, Sequence) or \
            not all(isinstance(c, Mapping) for c in checks):
        raise TypeError("checks is a list of dicts, one per limit")
    return _request("take", dict(checks=[dict(c) for c in checks], cost=cost, request_id=request_id,
                                 timeout_ms=timeout_ms, headers=True if headers else None,
                                 traceparent=traceparent, tracestate=tracestate))


# -- errors ---------------------------------------------------------------


class QuotadError(Exception):
    """Base of every error this package raises.

    code    -- the protocol's error code ("CONFLICT", "INVALID", ...), or one
               of this client's own: "CONNECTION", "TIMEOUT", "OUTCOME_UNKNOWN"
    message -- for people; it may change between versions
    reply   -- the sidecar's whole error reply, when there was one
    """

    code: str
    message: str
    reply: Optional[Reply]

    def __init__(self, code: str, message: str, reply: Optional[Reply] = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.reply = reply


class Invalid(QuotadError):
    """INVALID: the request is malformed or out of range; fix it."""


class TooLarge(QuotadError):
    """TOO_LARGE: the request line exceeded the sidecar's --max-line-bytes."""


class UnknownPolicy(QuotadError):
    """UNKNOWN_POLICY: no policy of that name in the sidecar's config."""


class Conflict(QuotadError):
    """CONFLICT: the request_id was accepted with another cost; nothing changed."""


class PolicyMismatch(QuotadError):
    """POLICY: inline limits differ from the live window's; nothing changed."""


class WrongType(QuotadError):
    """WRONGTYPE: the subject's Redis key holds data quotad did not write."""


class RequestIdsFull(QuotadError):
    """REQUEST_IDS_FULL: the window holds the most request ids it may."""


class Unavailable(QuotadError):
    """UNAVAILABLE: Redis did not decide; for a take the outcome is unknown
    unless the message says otherwise. Retry with the same request_id."""


class ShuttingDown(QuotadError):
    """SHUTTING_DOWN: the sidecar is draining. The clients retry resendable
    calls on a new connection themselves; this is raised only when that
    retry ran out of time."""


class Internal(QuotadError):
    """INTERNAL, and any code this client does not know (PROTOCOL.md says to
    treat those like INTERNAL); .code holds the code as sent."""


class ConnectionError(QuotadError, builtins.ConnectionError):
    """The sidecar could not be reached, or the connection failed in a way
    that resending could not repair. Also an OSError, like the built-in
    ConnectionError."""

    def __init__(self, message: str) -> None:
        QuotadError.__init__(self, "CONNECTION", message)


class Timeout(ConnectionError, builtins.TimeoutError):
    """No reply within the call's timeout (for a call that was safe to
    resend, or that was never written)."""

    def __init__(self, message: str) -> None:
        QuotadError.__init__(self, "TIMEOUT", message)


class OutcomeUnknown(QuotadError):
    """A take without a request_id was written, and then the connection was
    lost, the sidecar shut down, or the timeout passed before its reply.
    It may or may not have been counted; it was not sent again. Give takes
    a request_id to have them resent safely instead."""

    def __init__(self, message: str, reply: Optional[Reply] = None) -> None:
        QuotadError.__init__(self, "OUTCOME_UNKNOWN", message, reply)


_ERRORS_BY_CODE: Dict[str, Type[QuotadError]] = {
    "INVALID": Invalid,
    "TOO_LARGE": TooLarge,
    "UNKNOWN_POLICY": UnknownPolicy,
    "CONFLICT": Conflict,
    "POLICY": PolicyMismatch,
    "WRONGTYPE": WrongType,
    "REQUEST_IDS_FULL": RequestIdsFull,
    "UNAVAILABLE": Unavailable,
    "SHUTTING_DOWN": ShuttingDown,
    "INTERNAL": Internal,
}


def error_from_reply(reply: Mapping[str, Any]) -> QuotadError:
    """The exception for an error reply ({"ok": false, "error": ...})."""
    code = reply.get("error")
    if not isinstance(code, str) or not code:
        code = "INTERNAL"
    message = reply.get("message")
    cls = _ERRORS_BY_CODE.get(code, Internal)
    return cls(code, message if isinstance(message, str) else "", dict(reply))


# -- requests -------------------------------------------------------------


def _request(op: str, fields: Mapping[str, Any]) -> Reply:
    """A request dict holding the fields that were given (None is absent)."""
    req: Reply = {"op": op}
    req.update((k, v) for k, v in fields.items() if v is not None)
    return req


def rate_limit_headers(reply: Mapping[str, Any]) -> Dict[str, str]:
    """The HTTP header fields of a take or peek reply asked with
    headers=True, as a new dict to merge into a response's headers:
    RateLimit-Policy, RateLimit and, on a denial, Retry-After. Empty when
    the reply has none (the request did not ask, or it is not a take or
    peek); nothing is computed here, the sidecar renders every value."""
    fields = reply.get("headers")
    if not isinstance(fields, Mapping):
        return {}
    return {str(k): str(v) for k, v in fields.items()}


def _resendable(req: Mapping[str, Any]) -> bool:
    """Whether sending req twice has the effect of sending it once: every
    op but a take without a request_id."""
    return req.get("op") != "take" or req.get("request_id") is not None


class _Call:
    """One request of a call and what became of it."""

    __slots__ = ("req", "user_id", "resendable", "id", "line", "written", "reply", "error")

    def __init__(self, req: Mapping[str, Any]) -> None:
        if not isinstance(req, Mapping):
            raise TypeError(f"a quotad request is a dict, not {type(req).__name__}")
        self.req = dict(req)
        self.user_id = self.req.pop("id", None)
        self.resendable = _resendable(self.req)
        self.id = 0
        self.line = b""
        self.written = False
        self.reply: Optional[Reply] = None
        self.error: Optional[QuotadError] = None

    def encode(self, call_id: int) -> None:
        """Give the request a fresh id (replies are matched by it) and
        encode it; a resent request gets a new id on the new connection."""
        self.id = call_id
        body = dict(self.req)
        body["id"] = call_id
        # json.dumps escapes control characters: the line holds no raw "\n".
        self.line = json.dumps(body, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        self.written = False
        self.reply = None

    def settle(self, reply: Reply, retry: List["_Call"]) -> bool:
        """Record reply; returns False when the connection should not be
        used again (the sidecar is shutting down)."""
        if reply.get("ok") is False and reply.get("error") == "SHUTTING_DOWN":
            if self.resendable:
                retry.append(self)
            else:
                self.error = OutcomeUnknown(
                    "quotad was shutting down and may have cut off this take; "
                    "it was not sent again (give takes a request_id to have them resent)",
                    reply,
                )
            return False
        self.reply = reply
        return True

    def lost(self, why: str, retry: List["_Call"]) -> None:
        """The connection failed before this request's reply arrived."""
        if self.resendable or not self.written:
            retry.append(self)
        else:
            self.error = OutcomeUnknown(
                f"connection to quotad lost after the take was sent ({why}); "
                "it may or may not have been counted, and was not sent again"
            )

    def timed_out(self, timeout: Optional[float]) -> None:
        if self.written and not self.resendable:
            self.error = OutcomeUnknown(
                f"no reply from quotad within {timeout} s to a take without request_id; "
                "it may or may not have been counted"
            )
        else:
            self.error = Timeout(f"no reply from quotad within {timeout} s")

    def result(self) -> Reply:
        """The reply as the caller sees it: with the caller's own id, if any."""
        if self.error is not None:
            return {"ok": False, "error": self.error.code, "message": self.error.message}
        reply = dict(self.reply or {})
        reply.pop("id", None)
        if self.user_id is not None:
            reply = {"id": self.user_id, **reply}
        return reply


def _check_reply(line: bytes, call_id: int) -> Reply:
    """Decode one reply line meant for the request with call_id."""
    try:
        reply = json.loads(line)
    except ValueError as e:
        raise _BadReply(f"quotad sent a reply that is not JSON ({e}): {line[:200]!r}") from None
    if not isinstance(reply, dict):
        raise _BadReply(f"quotad sent a reply that is not a JSON object: {line[:200]!r}")
    # A reply without an id answers a line the sidecar could not parse
    # (TOO_LARGE); replies come in request order, so it is this one's.
    if "id" in reply and reply["id"] != call_id:
        raise _BadReply(f"quotad answered request {reply['id']!r} where {call_id} was expected")
    return cast(Reply, reply)


def _raise_for(call: _Call) -> Reply:
    """call's reply, or its error raised."""
    if call.error is not None:
        raise call.error
    reply = call.result()
    if reply.get("ok") is False:
        raise error_from_reply(reply)
    return reply


class _BadReply(Exception):
    """The connection cannot be trusted any more: garbled or stray reply."""


def _backoff(attempt: int) -> float:
    return float(min(_BACKOFF_MAX, _BACKOFF_FIRST * (2 ** min(attempt, 10))))


def _timeout_of(timeout: Optional[float], default: Optional[float]) -> Optional[float]:
    t = default if timeout is None else timeout
    if t is not None and not t > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, not {t!r}")
    return t


# -- threads --------------------------------------------------------------


class _Conn:
    """One socket, used by one call at a time."""

    def __init__(self, path: str, timeout: Optional[float]) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.settimeout(timeout)
            self.sock.connect(path)
        except BaseException:
            self.sock.close()
            raise
        self.buf = bytearray()

    def close(self) -> None:
        self.sock.close()

    def idle_ok(self) -> bool:
        """Whether an idle connection is still open with nothing unread: a
        sidecar that restarted closed it, and a request written to it would
        be lost."""
        try:
            # Timeout 0: a socket with a timeout would wait for data first.
            self.sock.settimeout(0)
            self.sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        return False  # EOF, or bytes nobody asked for

    def exchange(self, calls: Sequence[_Call], deadline: Optional[float]) -> None:
        """Write calls in chunks and read each chunk's replies, in order."""
        for i in range(0, len(calls), PIPELINE_CHUNK):
            chunk = calls[i:i + PIPELINE_CHUNK]
            data = b"".join(c.line for c in chunk)
            sent = 0
            try:
                while sent < len(data):
                    self._set_deadline(deadline)
                    sent += self.sock.send(data[sent:])
            finally:
                # A request counts as written once any of it is: the sidecar
                # may have read it whole even if the send then failed.
                offset = 0
                for c in chunk:
                    c.written = offset < sent
                    offset += len(c.line)
            for c in chunk:
                c.reply = _check_reply(self._read_line(deadline), c.id)

    def _set_deadline(self, deadline: Optional[float]) -> None:
        if deadline is None:
            self.sock.settimeout(None)
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("timed out")
        self.sock.settimeout(left)

    def _read_line(self, deadline: Optional[float]) -> bytes:
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                line = bytes(self.buf[:nl])
                del self.buf[:nl + 1]
                return line
            if len(self.buf) > MAX_REPLY_BYTES:
                raise _BadReply("quotad reply line too long")
            self._set_deadline(deadline)
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("quotad closed the connection")
            self.buf += data


class Client:
    """A thread-safe client: share one per process.

    path            -- the sidecar's socket
    timeout         -- seconds each call may take, connecting again and
                       resending included (None: no limit); each method
                       takes its own timeout too
    max_connections -- connections open at once; a thread that finds all
                       of them busy waits for one (within its timeout)

    The constructor connects once and raises ConnectionError if the socket
    does not answer, so a wrong path shows at once.
    """

    def __init__(self, path: str = DEFAULT_SOCKET, timeout: Optional[float] = DEFAULT_TIMEOUT, *,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        if not isinstance(max_connections, int) or max_connections < 1:
            raise ValueError(f"max_connections must be an integer of at least 1, not {max_connections!r}")
        self._path = path
        self._timeout = _timeout_of(None, timeout)
        self._max = max_connections
        self._cond = threading.Condition()
        self._idle: List[_Conn] = []
        self._open = 0  # connections in use or idle, or being opened
        self._closed = False
        self._ids = itertools.count(1)
        self._reconnects = 0
        # Set once a connection was lost: the next connection waits for a
        # sidecar that reaches Redis before carrying calls.
        self._lost = False
        try:
            first = _Conn(path, self._timeout)
        except OSError as e:
            raise ConnectionError(f"cannot connect to quotad at {path}: {e}") from e
        self._idle.append(first)
        self._open = 1

    @property
    def reconnects(self) -> int:
        """Connections dropped because they failed or the sidecar went away."""
        return self._reconnects

    def close(self) -> None:
        """Close every connection; calls still running fail with ConnectionError."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            conn.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- operations -------------------------------------------------------

    def take(self, subject: str, policy: Optional[str] = None, limit: Optional[int] = None,
             window_ms: Optional[int] = None, cost: int = 1, request_id: Optional[str] = None, *,
             algorithm: Optional[str] = None, rate: Optional[int] = None,
             period_ms: Optional[int] = None, burst: Optional[int] = None,
             lease_ms: Optional[int] = None, period: Optional[str] = None,
             time_zone: Optional[str] = None, week_start: Optional[str] = None,
             jitter_ms: Optional[int] = None, timeout_ms: Optional[int] = None,
             headers: bool = False, traceparent: Optional[str] = None, tracestate: Optional[str] = None,
             timeout: Optional[float] = None) -> TakeReply:
        """Consume cost units of subject's quota.

        Address the quota by a named policy, or inline: limit and window_ms
        (fixed window); algorithm="token_bucket" with rate, period_ms and
        burst; algorithm="concurrency" with limit and lease_ms (its take
        needs a request_id: it names the lease); algorithm="sliding_window"
        with limit and window_ms; algorithm="calendar" with limit and period
        ("minute" to "month"), and optionally time_zone (an IANA name,
        default "UTC"), week_start (of a "week", default "monday") and
        jitter_ms. A request_id makes the take
        safe to retry, and lets the client resend it after a lost
        connection. timeout_ms shortens the sidecar's Redis deadline;
        timeout (seconds) bounds this call here. headers=True adds the
        reply's RateLimit header fields (see rate_limit_headers).
        traceparent and tracestate carry the caller's W3C trace context.
        """
        req = _request("take", dict(subject=subject, policy=policy, limit=limit, window_ms=window_ms,
                                    cost=cost, request_id=request_id, algorithm=algorithm, rate=rate,
                                    period_ms=period_ms, burst=burst, lease_ms=lease_ms,
                                    period=period, time_zone=time_zone, week_start=week_start,
                                    jitter_ms=jitter_ms, timeout_ms=timeout_ms,
                                    headers=True if headers else None, traceparent=traceparent, tracestate=tracestate))
        return cast(TakeReply, self.request(req, timeout=timeout))

    def peek(self, subject: str, policy: Optional[str] = None, limit: Optional[int] = None,
             window_ms: Optional[int] = None, *, algorithm: Optional[str] = None,
             rate: Optional[int] = None, period_ms: Optional[int] = None,
             burst: Optional[int] = None, lease_ms: Optional[int] = None,
             period: Optional[str] = None, time_zone: Optional[str] = None,
             week_start: Optional[str] = None, jitter_ms: Optional[int] = None,
             timeout_ms: Optional[int] = None, headers: bool = False,
             traceparent: Optional[str] = None, tracestate: Optional[str] = None,
             timeout: Optional[float] = None) -> PeekReply:
        """Report subject's quota without consuming any (addressed as for take)."""
        req = _request("peek", dict(subject=subject, policy=policy, limit=limit, window_ms=window_ms,
                                    algorithm=algorithm, rate=rate, period_ms=period_ms, burst=burst,
                                    lease_ms=lease_ms, period=period, time_zone=time_zone,
                                    week_start=week_start, jitter_ms=jitter_ms, timeout_ms=timeout_ms,
                                    headers=True if headers else None, traceparent=traceparent, tracestate=tracestate))
        return cast(PeekReply, self.request(req, timeout=timeout))

    def release(self, subject: str, request_id: str, policy: Optional[str] = None, *,
                algorithm: Optional[str] = None, limit: Optional[int] = None,
                lease_ms: Optional[int] = None, timeout_ms: Optional[int] = None,
                traceparent: Optional[str] = None, tracestate: Optional[str] = None,
                timeout: Optional[float] = None) -> ReleaseReply:
        """Free the concurrency lease request_id of subject, addressed as for
        take. reply["released"] is False when no such lease was held, which
        is not an error: a release is safe to retry."""
        req = _request("release", dict(subject=subject, request_id=request_id, policy=policy,
                                       algorithm=algorithm, limit=limit, lease_ms=lease_ms,
                                       timeout_ms=timeout_ms, traceparent=traceparent, tracestate=tracestate))
        return cast(ReleaseReply, self.request(req, timeout=timeout))

    def settle(self, subject: str, policy: Optional[str] = None, limit: Optional[int] = None,
               window_ms: Optional[int] = None, *, request_id: str, cost: int,
               algorithm: Optional[str] = None, rate: Optional[int] = None,
               period_ms: Optional[int] = None, burst: Optional[int] = None,
               period: Optional[str] = None, time_zone: Optional[str] = None,
               week_start: Optional[str] = None, jitter_ms: Optional[int] = None,
               timeout_ms: Optional[int] = None, headers: bool = False,
               traceparent: Optional[str] = None, tracestate: Optional[str] = None,
               timeout: Optional[float] = None) -> SettleReply:
        """Give the actual cost of the accepted take request_id of subject,
        addressed as that take was: lower than it reserved gives the rest
        back, 0 gives it all back (a refund), higher consumes the extra even
        past the limit. The same settle again is a replay; another cost
        raises Conflict. reply["settled"] is False when the state no longer
        holds the take (its window ended) or never did: nothing changed,
        which is not an error. A settle is safe to retry."""
        req = _request("settle", dict(subject=subject, policy=policy, limit=limit, window_ms=window_ms,
                                      cost=cost, request_id=request_id, algorithm=algorithm, rate=rate,
                                      period_ms=period_ms, burst=burst, period=period,
                                      time_zone=time_zone, week_start=week_start, jitter_ms=jitter_ms,
                                      timeout_ms=timeout_ms, headers=True if headers else None, traceparent=traceparent, tracestate=tracestate))
        return cast(SettleReply, self.request(req, timeout=timeout))

    def take_checks(self, checks: Sequence[Check], cost: int = 1, request_id: Optional[str] = None, *,
                    timeout_ms: Optional[int] = None, headers: bool = False,
                    traceparent: Optional[str] = None, tracestate: Optional[str] = None,
                    timeout: Optional[float] = None) -> MultiTakeReply:
        """Take several limits at once, all or nothing.

        checks holds 1 to 8 dicts, each addressed as for take (policy, or
        inline limits, and subject), with an optional cost of its own; cost
        is the take's, for the checks that give none. Either every check
        consumes or none does: reply["allowed"] is the take's verdict and
        reply["checks"] each check's decision, in order. The same
        request_id replays every check; another set of checks or costs
        under it raises Conflict.
        """
        req = _checks_request(checks, cost, request_id, timeout_ms, headers, traceparent, tracestate)
        return cast(MultiTakeReply, self.request(req, timeout=timeout))

    def ping(self, *, timeout: Optional[float] = None) -> PingReply:
        """Check the sidecar and its store."""
        return cast(PingReply, self.request({"op": "ping"}, timeout=timeout))

    def request(self, req: Mapping[str, Any], *, timeout: Optional[float] = None) -> Reply:
        """Send one raw request dict; return its reply or raise its error."""
        call = _Call(req)
        self._run([call], _timeout_of(timeout, self._timeout))
        return _raise_for(call)

    def pipeline(self, reqs: Iterable[Mapping[str, Any]], *, timeout: Optional[float] = None) -> List[Reply]:
        """Send many raw request dicts in few writes; return the replies in
        request order. Error replies are returned in place (check
        reply["ok"]) rather than raised, so one bad request does not hide
        the others' answers; so is a take whose outcome is unknown
        ("error": "OUTCOME_UNKNOWN"). A request's own "id" is given back in
        its reply. Raises ConnectionError if the sidecar cannot be reached."""
        calls = [_Call(r) for r in reqs]
        self._run(calls, _timeout_of(timeout, self._timeout))
        for c in calls:
            if isinstance(c.error, ConnectionError):
                raise c.error
        return [c.result() for c in calls]

    # -- internals --------------------------------------------------------

    def _run(self, calls: List[_Call], timeout: Optional[float]) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        todo = calls
        last = ""
        for attempt in range(_MAX_ATTEMPTS):
            if not todo:
                return
            if attempt > 0:
                self._pause(attempt, deadline)
            try:
                conn = self._acquire(deadline)
            except QuotadError as e:
                for c in todo:
                    c.error = e
                return
            for c in todo:
                c.encode(next(self._ids))
            retry: List[_Call] = []
            keep = True
            try:
                conn.exchange(todo, deadline)
            except socket.timeout:
                for c in todo:
                    if c.reply is None:
                        c.timed_out(timeout)
                self._drop(conn)
                return
            except (OSError, EOFError, _BadReply) as e:
                last = str(e) or type(e).__name__
                for c in todo:
                    if c.reply is None:
                        c.lost(last, retry)
                    else:
                        keep = c.settle(c.reply, retry) and keep
                self._drop(conn)
                todo = retry
                continue
            except BaseException:
                self._drop(conn)
                raise
            for c in todo:
                assert c.reply is not None
                keep = c.settle(c.reply, retry) and keep
            if keep:
                self._release(conn)
            else:
                self._drop(conn)
            todo = retry
        for c in todo:
            c.error = ConnectionError(f"quotad connection kept failing ({last}); gave up after {_MAX_ATTEMPTS} attempts")

    def _pause(self, attempt: int, deadline: Optional[float]) -> None:
        pause = _backoff(attempt)
        if deadline is not None:
            pause = min(pause, max(0.0, deadline - time.monotonic()))
        time.sleep(pause)

    def _acquire(self, deadline: Optional[float]) -> _Conn:
        with self._cond:
            while True:
                if self._closed:
                    raise ConnectionError("quotad client is closed")
                while self._idle:
                    conn = self._idle.pop()
                    if conn.idle_ok():
                        return conn
                    conn.close()
                    self._open -= 1
                    self._reconnects += 1
                    self._lost = True
                if self._open < self._max:
                    self._open += 1
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise Timeout(f"all {self._max} quotad connections stayed busy")
                self._cond.wait(left)
        try:
            return self._connect(deadline)
        except BaseException:
            with self._cond:
                self._open -= 1
                self._cond.notify()
            raise

    def _connect(self, deadline: Optional[float]) -> _Conn:
        """Open a connection, trying again while the socket is missing or
        refuses (a sidecar restarting) until the deadline."""
        attempt = 0
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            conn: Optional[_Conn] = None
            try:
                if left is not None and left <= 0:
                    raise socket.timeout("timed out")
                conn = _Conn(self._path, left)
                if self._lost:
                    self._await_ready(conn, deadline)
                return conn
            except (OSError, EOFError, _BadReply) as e:
                if conn is not None:
                    conn.close()
                attempt += 1
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise Timeout(f"no ready quotad at {self._path} within the timeout: {e}") from e
                if attempt >= _MAX_ATTEMPTS * 4:
                    raise ConnectionError(f"cannot connect to quotad at {self._path}: {e}") from e
                time.sleep(_backoff(attempt) if left is None else min(_backoff(attempt), left))

    def _await_ready(self, conn: _Conn, deadline: Optional[float]) -> None:
        """Ping until the sidecar says it reaches Redis. A sidecar that just
        started answers UNAVAILABLE (not run) until then; the calls being
        resent should wait for it rather than fail. Once the deadline is
        near, the calls go anyway and get the sidecar's own answer."""
        attempt = 0
        while True:
            ping = _Call({"op": "ping"})
            ping.encode(next(self._ids))
            conn.exchange([ping], deadline)
            reply = ping.reply or {}
            if reply.get("redis_ok") is True:
                self._lost = False
                return
            if reply.get("error") == "SHUTTING_DOWN":
                raise EOFError("quotad is shutting down")
            attempt += 1
            pause = _backoff(attempt)
            if attempt >= _MAX_ATTEMPTS or deadline is not None and deadline - time.monotonic() <= pause:
                return
            time.sleep(pause)

    def _release(self, conn: _Conn) -> None:
        with self._cond:
            if self._closed:
                self._open -= 1
                conn.close()
            else:
                self._idle.append(conn)
            self._cond.notify()

    def _drop(self, conn: _Conn) -> None:
        conn.close()
        with self._cond:
            self._open -= 1
            self._reconnects += 1
            self._lost = True
            self._cond.notify()


# -- asyncio --------------------------------------------------------------


_LOST = object()  # a future's result: the connection failed first


class _Entry:
    __slots__ = ("id", "future")

    def __init__(self, call_id: int, future: "asyncio.Future[Any]") -> None:
        self.id = call_id
        self.future = future


class _AsyncConn:
    """One connection shared by every task; one reader task matches replies
    to the requests waiting, in order, checking each reply's id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.waiting: Deque[_Entry] = collections.deque()
        self.failure: Optional[str] = None  # set once the connection is unusable
        self.retired = False  # the sidecar is draining: send nothing new
        self.drain_lock = asyncio.Lock()
        self.task = asyncio.ensure_future(self._read_loop())

    def usable(self) -> bool:
        return self.failure is None and not self.retired

    def send(self, calls: Sequence[_Call]) -> List["asyncio.Future[Any]"]:
        """Queue calls and write them at once; no await in between, so the
        order on the wire is the order of self.waiting."""
        loop = asyncio.get_running_loop()
        futures = []
        if self.writer.transport.is_closing():
            # Lost before the reader noticed: nothing is written, so every
            # call may go on the next connection.
            self.fail(self.failure or "quotad closed the connection")
            for c in calls:
                lost: asyncio.Future[Any] = loop.create_future()
                lost.set_result(_LOST)
                futures.append(lost)
            return futures
        for c in calls:
            fut: asyncio.Future[Any] = loop.create_future()
            self.waiting.append(_Entry(c.id, fut))
            futures.append(fut)
        self.writer.write(b"".join(c.line for c in calls))
        for c in calls:
            c.written = True
        return futures

    async def drain(self) -> None:
        try:
            async with self.drain_lock:
                await self.writer.drain()
        except OSError as e:
            self.fail(str(e) or type(e).__name__)

    async def _read_loop(self) -> None:
        try:
            while True:
                try:
                    line = await self.reader.readuntil(b"\n")
                except asyncio.IncompleteReadError:
                    self.fail("quotad closed the connection")
                    return
                except asyncio.LimitOverrunError:
                    self.fail("quotad reply line too long")
                    return
                if not self.waiting:
                    self.fail("quotad sent a reply nobody asked for")
                    return
                entry = self.waiting.popleft()
                try:
                    reply = _check_reply(line, entry.id)
                except _BadReply as e:
                    self.waiting.appendleft(entry)
                    self.fail(str(e))
                    return
                if not entry.future.done():
                    entry.future.set_result(reply)
        except OSError as e:
            self.fail(str(e) or type(e).__name__)
        except asyncio.CancelledError:
            self.fail("quotad client is closed")
            raise

    def fail(self, why: str) -> None:
        if self.failure is None:
            self.failure = why
        waiting, self.waiting = self.waiting, collections.deque()
        for entry in waiting:
            if not entry.future.done():
                entry.future.set_result(_LOST)
        self.writer.close()

    async def close(self) -> None:
        self.fail("quotad client is closed")
        if not self.task.done():
            self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass
        try:
            await self.writer.wait_closed()
        except OSError:
            pass


class AsyncClient:
    """The asyncio client: one object for any number of tasks.

    Connects on first use, over one connection that carries every task's
    requests at once; replies are matched by the protocol's id. The
    methods are those of Client, as coroutines. Use it inside one event
    loop; `async with AsyncClient(path) as q:` closes it at the end.
    """

    def __init__(self, path: str = DEFAULT_SOCKET, timeout: Optional[float] = DEFAULT_TIMEOUT) -> None:
        self._path = path
        self._timeout = _timeout_of(None, timeout)
        self._conn: Optional[_AsyncConn] = None
        self._connect_lock: Optional[asyncio.Lock] = None
        self._closed = False
        self._ids = itertools.count(1)
        self._connections = 0
        self._old: List[_AsyncConn] = []
        # Set once a connection was lost: the next connection waits for a
        # sidecar that reaches Redis before carrying calls.
        self._lost = False

    @property
    def reconnects(self) -> int:
        """Connections opened after the first one."""
        return max(0, self._connections - 1)

    async def connect(self) -> "AsyncClient":
        """Connect now (calls connect by themselves otherwise); raises
        ConnectionError if the socket does not answer."""
        await self._connection(None if self._timeout is None else time.monotonic() + self._timeout, retry=False)
        return self

    async def close(self) -> None:
        """Close the connection; calls still waiting fail with ConnectionError
        (or OutcomeUnknown for a take without request_id already sent)."""
        self._closed = True
        conns = self._old + ([self._conn] if self._conn else [])
        self._conn, self._old = None, []
        for conn in conns:
            await conn.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- operations -------------------------------------------------------

    async def take(self, subject: str, policy: Optional[str] = None, limit: Optional[int] = None,
                   window_ms: Optional[int] = None, cost: int = 1, request_id: Optional[str] = None, *,
                   algorithm: Optional[str] = None, rate: Optional[int] = None,
                   period_ms: Optional[int] = None, burst: Optional[int] = None,
                   lease_ms: Optional[int] = None, period: Optional[str] = None,
                   time_zone: Optional[str] = None, week_start: Optional[str] = None,
                   jitter_ms: Optional[int] = None, timeout_ms: Optional[int] = None,
                   headers: bool = False, traceparent: Optional[str] = None, tracestate: Optional[str] = None,
                   timeout: Optional[float] = None) -> TakeReply:
        """Consume cost units of subject's quota; see Client.take."""
        req = _request("take", dict(subject=subject, policy=policy, limit=limit, window_ms=window_ms,
                                    cost=cost, request_id=request_id, algorithm=algorithm, rate=rate,
                                    period_ms=period_ms, burst=burst, lease_ms=lease_ms,
                                    period=period, time_zone=time_zone, week_start=week_start,
                                    jitter_ms=jitter_ms, timeout_ms=timeout_ms,
                                    headers=True if headers else None, traceparent=traceparent, tracestate=tracestate))
        return cast(TakeReply, await self.request(req, timeout=timeout))

    async def peek(self, subject: str, policy: Optional[str] = None, limit: Optional[int] = None,
                   window_ms: Optional[int] = None, *, algorithm: Optional[str] = None,
                   rate: Optional[int] = None, period_ms: Optional[int] = None,
                   burst: Optional[int] = None, lease_ms: Optional[int] = None,
                   period: Optional[str] = None, time_zone: Optional[str] = None,
                   week_start: Optional[str] = None, jitter_ms: Optional[int] = None,
                   timeout_ms: Optional[int] = None, headers: bool = False,
                   traceparent: Optional[str] = None, tracestate: Optional[str] = None,
                   timeout: Optional[float] = None) -> PeekReply:
        """Report subject's quota without consuming any; see Client.peek."""
        req = _request("peek", dict(subject=subject, policy=policy, limit=limit, window_ms=window_ms,
                                    algorithm=algorithm, rate=rate, period_ms=period_ms, burst=burst,
                                    lease_ms=lease_ms, period=period, time_zone=time_zone,
                                    week_start=week_start, jitter_ms=jitter_ms, timeout_ms=timeout_ms,
                                    headers=True if headers else None, traceparent=traceparent, tracestate=tracestate))
        return cast(PeekReply, await self.request(req, timeout=timeout))

    async def release(self, subject: str, request_id: str, policy: Optional[str] = None, *,
                      algorithm: Optional[str] = None, limit: Optional[int] = None,
                      lease_ms: Optional[int] = None, timeout_ms: Optional[int] = None,
                      traceparent: Optional[str] = None, tracestate: Optional[str] = None,
                      timeout: Optional[float] = None) -> ReleaseReply:
        """Free a concurrency lease; see Client.release."""
        req = _request("release", dict(subject=subject, request_id=request_id, policy=policy,
                                       algorithm=algorithm, limit=limit, lease_ms=lease_ms,
                                       timeout_ms=timeout_ms, traceparent=traceparent, tracestate=tracestate))
        return cast(ReleaseReply, await self.request(req, timeout=timeout))

    async def settle(self, subject: str, policy: Optional[str] = None, limit: Optional[int] = None,
                     window_ms: Optional[int] = None, *, request_id: str, cost: int,
                     algorithm: Optional[str] = None, rate: Optional[int] = None,
                     period_ms: Optional[int] = None, burst: Optional[int] = None,
                     period: Optional[str] = None, time_zone: Optional[str] = None,
                     week_start: Optional[str] = None, jitter_ms: Optional[int] = None,
                     timeout_ms: Optional[int] = None, headers: bool = False,
                     traceparent: Optional[str] = None, tracestate: Optional[str] = None,
                     timeout: Optional[float] = None) -> SettleReply:
        """Give the actual cost of an accepted take; see Client.settle."""
        req = _request("settle", dict(subject=subject, policy=policy, limit=limit, window_ms=window_ms,
                                      cost=cost, request_id=request_id, algorithm=algorithm, rate=rate,
                                      period_ms=period_ms, burst=burst, period=period,
                                      time_zone=time_zone, week_start=week_start, jitter_ms=jitter_ms,
                                      timeout_ms=timeout_ms, headers=True if headers else None, traceparent=traceparent, tracestate=tracestate))
        return cast(SettleReply, await self.request(req, timeout=timeout))

    async def take_checks(self, checks: Sequence[Check], cost: int = 1, request_id: Optional[str] = None, *,
                          timeout_ms: Optional[int] = None, headers: bool = False,
                          traceparent: Optional[str] = None, tracestate: Optional[str] = None,
                          timeout: Optional[float] = None) -> MultiTakeReply:
        """Take several limits at once, all or nothing; see Client.take_checks."""
        req = _checks_request(checks, cost, request_id, timeout_ms, headers, traceparent, tracestate)
        return cast(MultiTakeReply, await self.request(req, timeout=timeout))

    async def ping(self, *, timeout: Optional[float] = None) -> PingReply:
        """Check the sidecar and its store."""
        return cast(PingReply, await self.request({"op": "ping"}, timeout=timeout))

    async def request(self, req: Mapping[str, Any], *, timeout: Optional[float] = None) -> Reply:
        """Send one raw request dict; return its reply or raise its error."""
        call = _Call(req)
        await self._run([call], _timeout_of(timeout, self._timeout))
        return _raise_for(call)

    async def pipeline(self, reqs: Iterable[Mapping[str, Any]], *,
                       timeout: Optional[float] = None) -> List[Reply]:
        """Send many raw request dicts in one write; see Client.pipeline."""
        calls = [_Call(r) for r in reqs]
        await self._run(calls, _timeout_of(timeout, self._timeout))
        for c in calls:
            if isinstance(c.error, ConnectionError):
                raise c.error
        return [c.result() for c in calls]

    # -- internals --------------------------------------------------------

    async def _run(self, calls: List[_Call], timeout: Optional[float]) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        todo = calls
        last = ""
        for attempt in range(_MAX_ATTEMPTS):
            if not todo:
                return
            if attempt > 0:
                pause = _backoff(attempt)
                if deadline is not None:
                    pause = min(pause, max(0.0, deadline - time.monotonic()))
                await asyncio.sleep(pause)
            try:
                conn = await self._connection(deadline)
            except QuotadError as e:
                for c in todo:
                    c.error = e
                return
            for c in todo:
                c.encode(next(self._ids))
            futures = conn.send(todo)
            await conn.drain()
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.wait(futures, timeout=left)
            retry: List[_Call] = []
            for c, fut in zip(todo, futures):
                if not fut.done():
                    c.timed_out(timeout)
                elif fut.result() is _LOST:
                    last = conn.failure or "connection lost"
                    self._lost = True
                    c.lost(last, retry)
                elif not c.settle(fut.result(), retry):
                    conn.retired = True
                    self._lost = True
            todo = retry
        for c in todo:
            c.error = ConnectionError(f"quotad connection kept failing ({last}); gave up after {_MAX_ATTEMPTS} attempts")

    async def _connection(self, deadline: Optional[float], retry: bool = True) -> _AsyncConn:
        conn = self._conn
        if conn is not None and conn.usable():
            return conn
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self._closed:
                raise ConnectionError("quotad client is closed")
            conn = self._conn
            if conn is not None and conn.usable():
                return conn
            if conn is not None:
                self._conn = None
                # A draining connection still reads the replies it is owed.
                if conn.failure is None:
                    self._old.append(conn)
                else:
                    await conn.close()
            self._old = [c for c in self._old if c.failure is None]
            attempt = 0
            while True:
                left = None if deadline is None else deadline - time.monotonic()
                try:
                    if left is not None and left <= 0:
                        raise socket.timeout("timed out")
                    reader, writer = await asyncio.wait_for(
                        asyncio.open_unix_connection(self._path, limit=MAX_REPLY_BYTES), left)
                    break
                except (OSError, asyncio.TimeoutError) as e:
                    attempt += 1
                    left = None if deadline is None else deadline - time.monotonic()
                    if retry and left is not None and left <= 0:
                        raise Timeout(f"no quotad at {self._path} within the timeout: {e or 'timed out'}") from e
                    if not retry or (left is not None and left <= 0) or attempt >= _MAX_ATTEMPTS * 4:
                        raise ConnectionError(f"cannot connect to quotad at {self._path}: {e or 'timed out'}") from e
                    await asyncio.sleep(_backoff(attempt) if left is None else min(_backoff(attempt), left))
            if self._closed:
                writer.close()
                raise ConnectionError("quotad client is closed")
            fresh = _AsyncConn(reader, writer)
            self._connections += 1
            if self._lost:
                await self._await_ready(fresh, deadline)
            self._conn = fresh
            return fresh

    async def _await_ready(self, conn: _AsyncConn, deadline: Optional[float]) -> None:
        """Ping until the sidecar says it reaches Redis; see Client._await_ready.
        A connection that fails meanwhile is left to the calls to notice."""
        attempt = 0
        while conn.usable():
            ping = _Call({"op": "ping"})
            ping.encode(next(self._ids))
            fut = conn.send([ping])[0]
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.wait([fut], timeout=left)
            if not fut.done() or fut.result() is _LOST:
                return
            reply = fut.result()
            if reply.get("redis_ok") is True:
                self._lost = False
                return
            if reply.get("error") == "SHUTTING_DOWN":
                conn.retired = True
                return
            attempt += 1
            pause = _backoff(attempt)
            if attempt >= _MAX_ATTEMPTS or deadline is not None and deadline - time.monotonic() <= pause:
                return
            await asyncio.sleep(pause)
