"""Calls that go on while the sidecar is restarted under them.

    QUOTAD_TEST_SOCKET=... QUOTAD_TEST_SUBJECT=... python3 restart.py ROUNDS

Threads sharing one Client and tasks sharing one AsyncClient take quota
without pause. Each round, once calls have been answered, this prints
"restart N" and waits for a line on stdin: the caller restarts the
sidecar on the same socket in between and then writes that line. After
the last round the script checks every call:

- a take with a request_id succeeded, with its own reply (every call has
  its own subject, limit and cost), and was counted exactly once;
- a take without one succeeded the same way, or raised OutcomeUnknown and
  was counted at most once (never resent);
- nothing else: no other error, no reply of another call;
- a client left idle across the restarts sends its next take, one without
  a request_id, on a new connection: it finds its old one closed before
  writing, so the take succeeds rather than having an unknown outcome.

It prints its figures as one JSON line and exits 1 if any check failed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from typing import Any, Dict, List, Optional

import quotad

SOCKET = os.environ["QUOTAD_TEST_SOCKET"]
PREFIX = os.environ["QUOTAD_TEST_SUBJECT"]
# Each call may wait this long (seconds) for the sidecar to come back.
TIMEOUT = 60.0
THREADS = 8
TASKS = 64
WINDOW_MS = 600000


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0
        self.unknown: List[str] = []  # subjects of takes whose outcome is unknown
        self.done: List[str] = []  # subjects of calls that succeeded
        self.problems: List[str] = []
        self.progress = threading.Condition(self.lock)

    def record(self, subject: str, n: int, reply: Optional[Dict[str, Any]], err: Optional[BaseException],
               resendable: bool) -> None:
        with self.lock:
            self.calls += 1
            if err is None:
                assert reply is not None
                limit, cost = 1000 + n % 1000, 1 + n % 5
                if not (reply.get("allowed") is True and reply.get("limit") == limit and reply.get("used") == cost):
                    self.problems.append(f"{subject}: wrong reply {reply}")
                else:
                    self.done.append(subject)
            elif isinstance(err, quotad.OutcomeUnknown) and not resendable:
                self.unknown.append(subject)
            else:
                self.problems.append(f"{subject}: {type(err).__name__}: {err}")
            self.progress.notify_all()

    def wait_for(self, calls: int) -> None:
        with self.lock:
            while self.calls < calls and not self.problems:
                self.progress.wait(1)


def params(n: int) -> Dict[str, Any]:
    return dict(limit=1000 + n % 1000, window_ms=WINDOW_MS, cost=1 + n % 5)


def main(rounds: int) -> int:
    tally = Tally()
    stop = threading.Event()
    seq = iter(range(10**9))
    seq_lock = threading.Lock()

    def next_n() -> int:
        with seq_lock:
            return next(seq)

    q = quotad.Client(SOCKET, timeout=TIMEOUT, max_connections=THREADS)
    idle = quotad.Client(SOCKET, timeout=TIMEOUT)
    idle.ping()

    def worker(w: int) -> None:
        while not stop.is_set():
            n = next_n()
            subject = f"{PREFIX}-r-{n}"
            # One thread in four takes without a request_id.
            resendable = w % 4 != 0
            reply: Optional[Dict[str, Any]] = None
            err: Optional[BaseException] = None
            try:
                if resendable:
                    reply = dict(q.take(subject, request_id=f"id-{n}", **params(n)))
                else:
                    reply = dict(q.take(subject, **params(n)))
            except quotad.QuotadError as e:
                err = e
            tally.record(subject, n, reply, err, resendable)

    aio_reconnects = [0]

    def asyncio_thread() -> None:
        async def run() -> None:
            async with quotad.AsyncClient(SOCKET, timeout=TIMEOUT) as a:
                async def task(t: int) -> None:
                    while not stop.is_set():
                        n = next_n()
                        subject = f"{PREFIX}-r-{n}"
                        resendable = t % 4 != 0
                        reply: Optional[Dict[str, Any]] = None
                        err: Optional[BaseException] = None
                        try:
                            if resendable:
                                reply = dict(await a.take(subject, request_id=f"id-{n}", **params(n)))
                            else:
                                reply = dict(await a.take(subject, **params(n)))
                        except quotad.QuotadError as e:
                            err = e
                        tally.record(subject, n, reply, err, resendable)

                await asyncio.gather(*(task(t) for t in range(TASKS)))
                aio_reconnects[0] = a.reconnects

        asyncio.run(run())

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(THREADS)]
    threads.append(threading.Thread(target=asyncio_thread))
    for t in threads:
        t.start()
    try:
        for r in range(1, rounds + 1):
            tally.wait_for(tally.calls + 300)
            print(f"restart {r}", flush=True)
            if sys.stdin.readline().strip() != "restarted":
                tally.problems.append("stdin closed before the sidecar was restarted")
                break
        # Calls go on after the last restart.
        tally.wait_for(tally.calls + 300)
    finally:
        stop.set()
        for t in threads:
            t.join()

    try:
        idle_reply = idle.take(f"{PREFIX}-idle", limit=1, window_ms=WINDOW_MS)
        if not (idle_reply["allowed"] and idle_reply["used"] == 1):
            tally.problems.append(f"idle client: wrong reply {idle_reply}")
    except quotad.QuotadError as e:
        tally.problems.append(f"idle client: {type(e).__name__}: {e}")
    idle.close()

    # Every call is counted in its own window: once if it succeeded, at
    # most once if its outcome is unknown.
    check = quotad.Client(SOCKET, timeout=TIMEOUT)
    counted_unknown = 0
    unknown = set(tally.unknown)
    for subject in tally.done + tally.unknown:
        n = int(subject.rsplit("-", 1)[1])
        p = check.peek(subject, limit=1000 + n % 1000, window_ms=WINDOW_MS)
        cost = 1 + n % 5
        if subject in unknown:
            if p["used"] not in (0, cost):
                tally.problems.append(f"{subject}: outcome unknown, counted {p['used']} of cost {cost}")
            counted_unknown += p["used"] == cost
        elif p["used"] != cost:
            tally.problems.append(f"{subject}: counted {p['used']}, want {cost}")
    check.close()
    q.close()

    print(json.dumps({"figures": "python restart", "rounds": rounds, "calls": tally.calls,
                      "succeeded": len(tally.done), "outcome_unknown": len(tally.unknown),
                      "outcome_unknown_counted": counted_unknown, "problems": len(tally.problems),
                      "thread_reconnects": q.reconnects, "asyncio_reconnects": aio_reconnects[0]},
                     separators=(",", ":")), flush=True)
    for problem in tally.problems[:20]:
        print("problem:", problem, file=sys.stderr)
    if q.reconnects == 0 or aio_reconnects[0] == 0:
        print("problem: a client never reconnected", file=sys.stderr)
        return 1
    return 1 if tally.problems else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
