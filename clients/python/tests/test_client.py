"""Tests of the quotad package against a running sidecar.

    QUOTAD_TEST_SOCKET=./quotad.sock QUOTAD_TEST_SUBJECT=run-1 python3 -m unittest discover -s tests

QUOTAD_TEST_SUBJECT prefixes every subject, so runs do not share windows.
Each check reads the reply's own fields: every call has a subject and a
limit of its own, so a reply given to the wrong caller shows.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import tempfile
import threading
import unittest
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

import quotad

SOCKET = os.environ.get("QUOTAD_TEST_SOCKET", "./quotad.sock")
PREFIX = os.environ.get("QUOTAD_TEST_SUBJECT", "pytest")

THREADS = 16
PER_THREAD = 300
TASKS = 1000


def figures(name: str, **values: Any) -> None:
    print(json.dumps({"figures": name, **values}, separators=(",", ":")), flush=True)


def expected(n: int) -> Tuple[int, int]:
    """The limit and cost of call n: both differ between neighbours."""
    return 1000 + n, 1 + n % 7


def mismatch(reply: Dict[str, Any], n: int) -> bool:
    limit, cost = expected(n)
    return not (reply.get("ok") is True and reply.get("allowed") is True and reply.get("limit") == limit
                and reply.get("used") == cost and reply.get("remaining") == limit - cost)


class SilentServer:
    """A socket that accepts connections and never answers: a sidecar stuck
    on something, for the timeout checks."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="qd")
        self.path = os.path.join(self.dir, "silent.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(16)
        self.conns: List[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()
        os.unlink(self.path)
        os.rmdir(self.dir)


class RecordingServer(SilentServer):
    """A socket that answers every request allowed and keeps what it read,
    to see what a client sends."""

    def __init__(self) -> None:
        self.requests: List[Dict[str, Any]] = []
        super().__init__()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn.makefile("rb") as lines:
            for line in lines:
                req = json.loads(line)
                self.requests.append(req)
                reply = {"id": req.get("id"), "ok": True, "allowed": True, "replay": False, "limit": 1, "used": 1,
                         "remaining": 0, "reset_ms": 1, "retry_after_ms": 0}
                try:
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                except OSError:
                    return


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class TraceContextTest(unittest.TestCase):
    def test_every_operation_sends_the_trace_context(self) -> None:
        srv = RecordingServer()
        self.addCleanup(srv.close)
        tp, ts = TRACEPARENT, "vendor=x"
        with quotad.Client(srv.path) as q:
            q.take("s", limit=1, window_ms=1000, traceparent=tp, tracestate=ts)
            q.peek("s", limit=1, window_ms=1000, traceparent=tp, tracestate=ts)
            q.release("s", "r-1", algorithm="concurrency", limit=1, lease_ms=1000, traceparent=tp, tracestate=ts)
            q.settle("s", limit=1, window_ms=1000, request_id="r-1", cost=0, traceparent=tp, tracestate=ts)
            q.take_checks([{"subject": "s", "limit": 1, "window_ms": 1000}], traceparent=tp, tracestate=ts)
            q.take("s", limit=1, window_ms=1000)

        async def run() -> None:
            async with quotad.AsyncClient(srv.path) as aq:
                await aq.take("s", limit=1, window_ms=1000, traceparent=tp, tracestate=ts)
                await aq.take_checks([{"subject": "s", "limit": 1, "window_ms": 1000}], traceparent=tp, tracestate=ts)
        asyncio.run(run())
        sent = [(r["op"], r.get("traceparent"), r.get("tracestate")) for r in srv.requests]
        want: List[Tuple[str, Optional[str], Optional[str]]] = [
            (op, TRACEPARENT, "vendor=x") for op in ("take", "peek", "release", "settle", "take")]
        want += [("take", None, None), ("take", TRACEPARENT, "vendor=x"), ("take", TRACEPARENT, "vendor=x")]
        self.assertEqual(sent, want)

    def test_the_sidecar_decides_as_without(self) -> None:
        s = f"{PREFIX}-traced"
        with quotad.Client(SOCKET) as q:
            r = q.take(s, limit=1, window_ms=2678400000, traceparent=TRACEPARENT)
            self.assertTrue(r["allowed"])
            r = q.take(s, limit=1, window_ms=2678400000, traceparent="not a trace context")
            self.assertFalse(r["allowed"])


class ThreadsTest(unittest.TestCase):
    def test_threads_share_one_client(self) -> None:
        mismatches: List[str] = []
        errors: List[BaseException] = []
        lock = threading.Lock()
        with quotad.Client(SOCKET, timeout=60) as q:

            def worker(w: int) -> None:
                try:
                    for i in range(PER_THREAD):
                        n = w * PER_THREAD + i
                        limit, cost = expected(n)
                        r = q.take(f"{PREFIX}-thr-{n}", limit=limit, window_ms=60000, cost=cost,
                                   request_id=f"t{w}-{i}")
                        if mismatch(dict(r), n):
                            with lock:
                                mismatches.append(f"call {n}: {r}")
                except BaseException as e:  # reported by the main thread
                    with lock:
                        errors.append(e)

            threads = [threading.Thread(target=worker, args=(w,)) for w in range(THREADS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            # A replay of one of them answers from that call's own window.
            limit, cost = expected(7)
            r = q.take(f"{PREFIX}-thr-7", limit=limit, window_ms=60000, cost=cost, request_id="t0-7")
            self.assertTrue(r["replay"])
            self.assertEqual(r["used"], cost)
        figures("python threads", threads=THREADS, calls=THREADS * PER_THREAD, mismatches=len(mismatches),
                errors=len(errors))
        self.assertEqual(errors, [])
        self.assertEqual(mismatches, [])

    def test_pipeline_in_threads(self) -> None:
        with quotad.Client(SOCKET) as q:
            results: Dict[int, List[Dict[str, Any]]] = {}

            def worker(w: int) -> None:
                reqs = [{"op": "take", "id": f"w{w}-{i}", "subject": f"{PREFIX}-pipe-{w}", "limit": 3,
                         "window_ms": 60000} for i in range(10)]
                results[w] = q.pipeline(reqs)

            threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        for w, replies in results.items():
            self.assertEqual([r["id"] for r in replies], [f"w{w}-{i}" for i in range(10)])
            self.assertEqual([r["used"] for r in replies], [1, 2, 3] + [3] * 7)
            self.assertEqual(sum(1 for r in replies if r["allowed"]), 3)
        self.assertEqual(len(results), 4)


class AsyncTest(unittest.TestCase):
    def test_tasks_share_one_client(self) -> None:
        async def main() -> Tuple[int, List[str]]:
            async with quotad.AsyncClient(SOCKET, timeout=60) as q:

                async def one(n: int) -> None:
                    limit, cost = expected(n)
                    r = await q.take(f"{PREFIX}-aio-{n}", limit=limit, window_ms=60000, cost=cost,
                                     request_id=f"a-{n}")
                    if mismatch(dict(r), n):
                        bad.append(f"call {n}: {r}")

                bad: List[str] = []
                await asyncio.gather(*(one(n) for n in range(TASKS)))
                # The same again without request ids, and peeks: each still
                # reads its own subject.
                peeks = await asyncio.gather(*(q.peek(f"{PREFIX}-aio-{n}", limit=expected(n)[0], window_ms=60000)
                                               for n in range(TASKS)))
                for n, p in enumerate(peeks):
                    if p["used"] != expected(n)[1] or p["limit"] != expected(n)[0]:
                        bad.append(f"peek {n}: {p}")
                return q.reconnects, bad

        reconnects, bad = asyncio.run(main())
        figures("python asyncio", tasks=TASKS, calls=2 * TASKS, mismatches=len(bad), reconnects=reconnects)
        self.assertEqual(bad, [])
        self.assertEqual(reconnects, 0)

    def test_errors_and_pipeline(self) -> None:
        async def main() -> None:
            async with quotad.AsyncClient(SOCKET) as q:
                s = f"{PREFIX}-aio-err"
                await q.take(s, limit=5, window_ms=60000, cost=2, request_id="o-1")
                with self.assertRaises(quotad.Conflict) as cm:
                    await q.take(s, limit=5, window_ms=60000, cost=1, request_id="o-1")
                self.assertEqual(cm.exception.code, "CONFLICT")
                with self.assertRaises(quotad.UnknownPolicy):
                    await q.peek(s, policy="no-such-policy")
                with self.assertRaises(TypeError):
                    await q.take(s, limit=5, window_ms=60000, requestid="x")  # type: ignore[call-arg]
                replies = await q.pipeline([{"op": "ping", "id": "p"}, {"op": "launch"}])
                self.assertEqual(replies[0]["id"], "p")
                self.assertTrue(replies[0]["ok"])
                self.assertEqual(replies[1]["error"], "INVALID")
                pong = await q.ping()
                self.assertTrue(pong["ok"])

        asyncio.run(main())

    def test_connection_error(self) -> None:
        async def main() -> None:
            q = quotad.AsyncClient("/nonexistent/quotad.sock", timeout=0.5)
            with self.assertRaises(quotad.ConnectionError) as cm:
                await q.connect()
            self.assertEqual(cm.exception.code, "CONNECTION")
            await q.close()

        asyncio.run(main())

    def test_timeout(self) -> None:
        silent = SilentServer()
        self.addCleanup(silent.close)

        async def main() -> None:
            async with quotad.AsyncClient(silent.path, timeout=0.2) as q:
                with self.assertRaises(quotad.Timeout) as cm:
                    await q.ping()
                self.assertEqual(cm.exception.code, "TIMEOUT")
                with self.assertRaises(quotad.OutcomeUnknown) as cu:
                    await q.take("x", limit=1, window_ms=1000)
                self.assertEqual(cu.exception.code, "OUTCOME_UNKNOWN")
                with self.assertRaises(quotad.Timeout):
                    await q.take("x", limit=1, window_ms=1000, request_id="r-1", timeout=0.1)

        asyncio.run(main())


class ErrorsTest(unittest.TestCase):
    def setUp(self) -> None:
        self.q = quotad.Client(SOCKET)
        self.addCleanup(self.q.close)

    def test_each_code_has_its_class(self) -> None:
        s = f"{PREFIX}-err"
        q = self.q
        q.take(s, limit=5, window_ms=60000, cost=2, request_id="order-1")
        cases: List[Tuple[Type[quotad.QuotadError], str, Callable[[], Any]]] = [
            (quotad.Conflict, "CONFLICT", lambda: q.take(s, limit=5, window_ms=60000, cost=1, request_id="order-1")),
            (quotad.Invalid, "INVALID", lambda: q.take(s, limit=5, window_ms=60000, cost=-1)),
            (quotad.PolicyMismatch, "POLICY", lambda: q.take(s, limit=6, window_ms=60000)),
            (quotad.UnknownPolicy, "UNKNOWN_POLICY", lambda: q.take(s, policy="no-such-policy")),
            (quotad.TooLarge, "TOO_LARGE", lambda: q.take("x" * 20000, limit=5, window_ms=60000)),
        ]
        for cls, code, call in cases:
            with self.subTest(code=code):
                with self.assertRaises(cls) as cm:
                    call()
                self.assertIsInstance(cm.exception, quotad.QuotadError)
                self.assertEqual(cm.exception.code, code)
                self.assertTrue(cm.exception.message)
                self.assertEqual(cm.exception.reply and cm.exception.reply["error"], code)

    def test_denial_is_a_reply(self) -> None:
        s = f"{PREFIX}-deny"
        self.assertTrue(self.q.take(s, limit=1, window_ms=60000)["allowed"])
        r = self.q.take(s, limit=1, window_ms=60000)
        self.assertFalse(r["allowed"])
        self.assertGreater(r["retry_after_ms"], 0)

    def test_rate_limit_headers(self) -> None:
        s = f"{PREFIX}-headers"
        self.assertEqual(quotad.rate_limit_headers(self.q.take(s, limit=1, window_ms=60000)), {})
        r = self.q.take(s, limit=1, window_ms=60000, headers=True)
        self.assertFalse(r["allowed"])
        h = quotad.rate_limit_headers(r)
        t = (r["reset_ms"] + 999) // 1000
        self.assertEqual(h, {"RateLimit-Policy": '"inline";q=1;w=60', "RateLimit": f'"inline";r=0;t={t}',
                             "Retry-After": str((r["retry_after_ms"] + 999) // 1000)})
        p = self.q.peek(s, limit=1, window_ms=60000, headers=True)
        self.assertEqual(set(quotad.rate_limit_headers(p)), {"RateLimit-Policy", "RateLimit"})

        async def main() -> None:
            async with quotad.AsyncClient(SOCKET) as q:
                r = await q.take(f"{s}-async", limit=2, window_ms=60000, headers=True)
                self.assertTrue(r["allowed"])
                self.assertEqual(quotad.rate_limit_headers(r)["RateLimit"],
                                 f'"inline";r=1;t={(r["reset_ms"] + 999) // 1000}')
                p = await q.peek(f"{s}-async", limit=2, window_ms=60000, headers=True)
                self.assertNotIn("Retry-After", quotad.rate_limit_headers(p))

        asyncio.run(main())

    def test_release(self) -> None:
        s = f"{PREFIX}-lease"
        jobs: Dict[str, Any] = dict(algorithm="concurrency", limit=1, lease_ms=30000)
        self.assertTrue(self.q.take(s, request_id="job-1", **jobs)["allowed"])
        self.assertFalse(self.q.take(s, request_id="job-2", **jobs)["allowed"])
        self.assertTrue(self.q.release(s, "job-1", **jobs)["released"])
        self.assertFalse(self.q.release(s, "job-1", **jobs)["released"])

    def test_settle(self) -> None:
        s = f"{PREFIX}-settle"
        w: Dict[str, Any] = dict(limit=10000, window_ms=60000)
        self.assertEqual(self.q.take(s, cost=2000, request_id="call-1", **w)["used"], 2000)
        r = self.q.settle(s, request_id="call-1", cost=1234, **w)
        self.assertEqual((r["settled"], r["replay"], r["reserved"], r["used"], r["remaining"]),
                         (True, False, 2000, 1234, 8766))
        self.assertTrue(self.q.settle(s, request_id="call-1", cost=1234, **w)["replay"])
        with self.assertRaises(quotad.Conflict):
            self.q.settle(s, request_id="call-1", cost=1500, **w)
        r = self.q.settle(s, request_id="never", cost=0, **w)
        self.assertFalse(r["settled"])
        self.assertEqual(r["used"], 1234)
        with self.assertRaises(quotad.Invalid):
            self.q.request({"op": "settle", "subject": s, "algorithm": "concurrency", "limit": 1,
                            "lease_ms": 1000, "request_id": "job", "cost": 1})
        with self.assertRaises(TypeError):
            self.q.settle(s, cost=1, limit=10000, window_ms=60000)  # type: ignore[call-arg]

        async def main() -> None:
            async with quotad.AsyncClient(SOCKET) as q:
                b: Dict[str, Any] = dict(algorithm="token_bucket", rate=1, period_ms=3600000, burst=10)
                await q.take(f"{s}-async", cost=6, request_id="up-1", **b)
                r = await q.settle(f"{s}-async", request_id="up-1", cost=0, headers=True, **b)
                self.assertEqual((r["settled"], r["remaining"]), (True, 10))
                self.assertNotIn("Retry-After", quotad.rate_limit_headers(r))

        asyncio.run(main())

    def test_sliding_window(self) -> None:
        s = f"{PREFIX}-sliding"
        sw: Dict[str, Any] = dict(algorithm="sliding_window", limit=3, window_ms=2678400000)
        r = self.q.take(s, cost=2, request_id="sw-1", **sw)
        self.assertTrue(r["allowed"])
        self.assertEqual(r["used"], 2)
        self.assertTrue(self.q.take(s, cost=2, request_id="sw-1", **sw)["replay"])
        r = self.q.take(s, cost=2, **sw)
        self.assertFalse(r["allowed"])
        self.assertGreater(r["retry_after_ms"], 0)
        self.assertEqual(self.q.peek(s, **sw)["used"], 2)

    def test_take_checks(self) -> None:
        user: quotad.Check = {"subject": f"{PREFIX}-multi-user", "limit": 5, "window_ms": 2678400000}
        tenant: quotad.Check = {"subject": f"{PREFIX}-multi-tenant", "algorithm": "token_bucket", "rate": 1,
                                "period_ms": 600000, "burst": 3, "cost": 2}
        r = self.q.take_checks([user, tenant], request_id="m-1", headers=True)
        self.assertTrue(r["allowed"])
        self.assertEqual([(c["allowed"], c["used"], c["remaining"]) for c in r["checks"]], [(True, 1, 4), (True, 2, 1)])
        self.assertEqual(quotad.rate_limit_headers(r)["RateLimit-Policy"], '"inline";q=5;w=2678400, "inline";q=3;w=1800')
        self.assertTrue(self.q.take_checks([user, tenant], request_id="m-1")["replay"])
        # The tenant has 1 token: denied, and the user's window is untouched.
        d = self.q.take_checks([user, tenant])
        self.assertFalse(d["allowed"])
        self.assertEqual([c["allowed"] for c in d["checks"]], [True, False])
        self.assertGreater(d["retry_after_ms"], 0)
        self.assertEqual(self.q.peek(user["subject"], limit=5, window_ms=2678400000)["used"], 1)
        with self.assertRaises(quotad.Conflict):
            self.q.take_checks([user], request_id="m-1")
        with self.assertRaises(quotad.Invalid):
            self.q.take_checks([user, user])
        with self.assertRaises(TypeError):
            self.q.take_checks(user)  # type: ignore[arg-type]

        async def run() -> None:
            async with quotad.AsyncClient(SOCKET) as q:
                a = await q.take_checks([user, tenant], request_id="m-1")
                self.assertTrue(a["replay"])
        asyncio.run(run())

    def test_unknown_codes_are_internal(self) -> None:
        e = quotad.error_from_reply({"ok": False, "error": "SOMETHING_NEW", "message": "m"})
        self.assertIsInstance(e, quotad.Internal)
        self.assertEqual(e.code, "SOMETHING_NEW")
        for code, cls in [("UNAVAILABLE", quotad.Unavailable), ("SHUTTING_DOWN", quotad.ShuttingDown),
                          ("WRONGTYPE", quotad.WrongType), ("REQUEST_IDS_FULL", quotad.RequestIdsFull),
                          ("INTERNAL", quotad.Internal)]:
            self.assertIs(type(quotad.error_from_reply({"ok": False, "error": code, "message": ""})), cls)

    def test_unknown_keyword_arguments(self) -> None:
        s = f"{PREFIX}-kw"
        calls: List[Callable[[], Any]] = [
            lambda: self.q.take(s, limit=5, window_ms=60000, requestid="x"),  # type: ignore[call-arg]
            lambda: self.q.take(s, algorithm="token_bucket", rate=1, period_ms=1000, brust=3),  # type: ignore[call-arg]
            lambda: self.q.peek(s, limit=5, window_ms=60000, cost=1),  # type: ignore[call-arg]
            lambda: self.q.release(s, "job-1", window_ms=1000),  # type: ignore[call-arg]
            lambda: self.q.ping(id=1),  # type: ignore[call-arg]
            lambda: quotad.Client(SOCKET, timout=1),  # type: ignore[call-arg]
        ]
        for i, call in enumerate(calls):
            with self.subTest(call=i):
                with self.assertRaises(TypeError):
                    call()
        # None of them reached the sidecar.
        self.assertEqual(self.q.peek(s, limit=5, window_ms=60000)["used"], 0)

    def test_connection_error(self) -> None:
        with self.assertRaises(quotad.ConnectionError) as cm:
            quotad.Client("/nonexistent/quotad.sock")
        self.assertEqual(cm.exception.code, "CONNECTION")
        self.assertIsInstance(cm.exception, OSError)
        self.assertIsInstance(cm.exception, quotad.QuotadError)

    def test_closed_client(self) -> None:
        q = quotad.Client(SOCKET)
        q.close()
        with self.assertRaises(quotad.ConnectionError):
            q.ping()

    def test_timeout(self) -> None:
        silent = SilentServer()
        self.addCleanup(silent.close)
        # A client each: after a timeout the next connection first waits
        # for a ping, which the silent server never answers either.
        with quotad.Client(silent.path, timeout=0.2) as q:
            with self.assertRaises(quotad.Timeout) as cm:
                q.ping()
            self.assertEqual(cm.exception.code, "TIMEOUT")
            self.assertIsInstance(cm.exception, TimeoutError)
            with self.assertRaises(quotad.Timeout):
                q.ping()
        with quotad.Client(silent.path, timeout=0.2) as q:
            with self.assertRaises(quotad.OutcomeUnknown):
                q.take("x", limit=1, window_ms=1000)
        with quotad.Client(silent.path, timeout=5) as q:
            with self.assertRaises(quotad.Timeout):
                q.peek("x", limit=1, window_ms=1000, timeout=0.1)


if __name__ == "__main__":
    unittest.main()
