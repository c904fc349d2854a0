"""Walk through quotad's semantics with the Python client.

    python3 demo.py ./quotad.sock demo-$(date +%s)

Prints one JSON line per step; exits 1 (with the reason on stderr) if the
sidecar does not answer as expected. Use a fresh subject for each run: the
window lasts 60 s and remembers request ids.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List

import quotad

LIMIT = 5
WINDOW_MS = 60000


class Failed(Exception):
    pass


def show(step: str, reply: Any) -> None:
    print(json.dumps({"step": step, "reply": reply}, separators=(",", ":")), flush=True)


def expect(cond: bool, what: str, reply: Any) -> None:
    if not cond:
        raise Failed(f"expected {what}, got {json.dumps(reply, separators=(',', ':'))}")


def run(q: quotad.Client, subject: str) -> None:
    def take(request_id: str, cost: int) -> quotad.TakeReply:
        reply = q.take(subject, limit=LIMIT, window_ms=WINDOW_MS, cost=cost, request_id=request_id)
        show("take", reply)
        return reply

    r = take("order-1", 2)
    expect(r["allowed"] and not r["replay"] and r["used"] == 2, "order-1 allowed, used 2", r)

    # Same request_id again, as a retry would: the original answer, nothing consumed.
    r = take("order-1", 2)
    expect(r["allowed"] and r["replay"] and r["used"] == 2, "order-1 replayed, used 2", r)

    r = take("order-2", 3)
    expect(r["allowed"] and not r["replay"] and r["used"] == 5, "order-2 allowed, used 5", r)

    # Over the limit: a denial is an answer, not an error.
    r = take("order-3", 1)
    expect(not r["allowed"] and r["used"] == 5 and r["retry_after_ms"] > 0, "order-3 denied, used 5", r)

    # Reusing a request_id with a different cost is a client bug: Conflict.
    try:
        r = q.take(subject, limit=LIMIT, window_ms=WINDOW_MS, cost=1, request_id="order-1")
    except quotad.Conflict as e:
        show("conflict", e.reply)
        expect(e.code == "CONFLICT", "error CONFLICT", e.reply)
    else:
        expect(False, "error CONFLICT", r)

    # A bad value is the sidecar's INVALID; a misspelled argument never
    # leaves the process.
    try:
        q.take(subject, limit=LIMIT, window_ms=WINDOW_MS, cost=-1)
    except quotad.Invalid as e:
        show("invalid", {"code": e.code, "message": e.message})
    else:
        expect(False, "error INVALID", None)
    try:
        q.take(subject, limit=LIMIT, window_ms=WINDOW_MS, requestid="order-4")  # type: ignore[call-arg]
    except TypeError as e:
        show("unknown option", {"error": str(e)})
    else:
        expect(False, "TypeError for requestid=", None)

    # Many requests in few writes; each reply carries its request's id.
    reqs: List[Dict[str, Any]] = [{"op": "take", "id": f"p-{i}", "subject": subject + "-pipe",
                                   "limit": 3, "window_ms": WINDOW_MS} for i in range(10)]
    replies = q.pipeline(reqs)
    show("pipeline", replies)
    expect([x.get("id") for x in replies] == [x["id"] for x in reqs], "replies with ids p-0..p-9", replies)
    expect(sum(1 for x in replies if x["allowed"]) == 3, "exactly 3 allowed", replies)

    # Concurrency leases: at most 2 jobs at once; a lease is released when done.
    lease = subject + "-cc"
    for job in ("job-1", "job-2"):
        r = q.take(lease, algorithm="concurrency", limit=2, lease_ms=30000, request_id=job)
        show("take", r)
        expect(r["allowed"] and r.get("lease_ms") == 30000, job + " granted a lease", r)
    r = q.take(lease, algorithm="concurrency", limit=2, lease_ms=30000, request_id="job-3")
    show("take", r)
    expect(not r["allowed"], "job-3 denied while 2 leases are held", r)
    rel = q.release(lease, "job-1", algorithm="concurrency", limit=2, lease_ms=30000)
    show("release", rel)
    expect(rel["released"] and rel["used"] == 1, "job-1 released", rel)
    for job in ("job-2", "job-3"):
        q.release(lease, job, algorithm="concurrency", limit=2, lease_ms=30000)

    # A calendar window: 2 units per day of Shanghai's clock, reset at its midnight.
    day = subject + "-cal"
    r = q.take(day, algorithm="calendar", limit=2, period="day", time_zone="Asia/Shanghai", cost=2,
               request_id="day-1")
    show("take", r)
    expect(r["allowed"] and r["used"] == 2 and 0 < r["reset_ms"] <= 86400000, "the day's quota taken", r)
    r = q.take(day, algorithm="calendar", limit=2, period="day", time_zone="Asia/Shanghai")
    show("take", r)
    expect(not r["allowed"] and r["retry_after_ms"] == r["reset_ms"], "denied until Shanghai's midnight", r)
    p = q.peek(day + "-week", algorithm="calendar", limit=5, period="week", week_start="sunday")
    show("peek", p)
    expect(p["used"] == 0 and p["reset_ms"] <= 7 * 86400000, "an unused week, reset at its end", p)


def main(argv: List[str]) -> int:
    if len(argv) != 3:
        print("usage: demo.py <socket_path> <subject>", file=sys.stderr)
        return 2
    try:
        with quotad.Client(argv[1]) as q:
            run(q, argv[2])
    except Failed as e:
        print(f"demo failed: {e}", file=sys.stderr)
        return 1
    except quotad.QuotadError as e:
        print(f"demo failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
