"""Walk through quotad's take semantics against a running sidecar.

    python3 demo.py ./quotad.sock demo-$(date +%s)

Prints one JSON line per step; exits 1 (with the reason on stderr) if the
sidecar does not answer as expected. Use a fresh subject for each run:
the window lasts 60 s and remembers request ids.
"""

import json
import sys

from quotad import Client, QuotadError

LIMIT = 5
WINDOW_MS = 60000


class Failed(Exception):
    pass


def show(step, reply):
    print(json.dumps({"step": step, "reply": reply}, separators=(",", ":")), flush=True)


def expect(cond, what, reply):
    if not cond:
        raise Failed("expected %s, got %s" % (what, json.dumps(reply, separators=(",", ":"))))


def run(q, subject):
    def take(request_id, cost):
        reply = q.take(subject, limit=LIMIT, window_ms=WINDOW_MS,
                       cost=cost, request_id=request_id)
        show("take", reply)
        return reply

    r = take("order-1", 2)
    expect(r["allowed"] and not r["replay"] and r["used"] == 2,
           "order-1 allowed, used 2", r)

    # Same request_id again, as a retry would: the original answer, nothing consumed.
    r = take("order-1", 2)
    expect(r["allowed"] and r["replay"] and r["used"] == 2,
           "order-1 replayed, used 2", r)

    r = take("order-2", 3)
    expect(r["allowed"] and not r["replay"] and r["used"] == 5,
           "order-2 allowed, used 5", r)

    # Over the limit: a denial is an answer, not an error.
    r = take("order-3", 1)
    expect(not r["allowed"] and r["used"] == 5, "order-3 denied, used 5", r)

    # Reusing a request_id with a different cost is a client bug.
    try:
        r = q.take(subject, limit=LIMIT, window_ms=WINDOW_MS,
                   cost=1, request_id="order-1")
    except QuotadError as e:
        show("take", e.reply)
        expect(e.code == "CONFLICT", "error CONFLICT", e.reply)
    else:
        show("take", r)
        expect(False, "error CONFLICT", r)

    # Pipelining: ten takes in one write against a limit of 3.
    reqs = [{"op": "take", "id": "p-%d" % i, "subject": subject + "-pipe",
             "limit": 3, "window_ms": WINDOW_MS} for i in range(10)]
    replies = q.pipeline(reqs)
    show("pipeline", replies)
    expect([r.get("id") for r in replies] == [r["id"] for r in reqs],
           "replies in request order (ids p-0..p-9)", replies)
    expect(all(r.get("ok") for r in replies), "no error replies", replies)
    expect(sum(1 for r in replies if r["allowed"]) == 3,
           "exactly 3 allowed", replies)

    # A token bucket: 3 tokens, one more every 20 s; no window boundary.
    bucket = dict(algorithm="token_bucket", rate=1, period_ms=20000, burst=3)
    r = q.take(subject + "-tb", cost=2, request_id="upload-1", **bucket)
    show("take", r)
    expect(r["allowed"] and r["remaining"] == 1, "upload-1 allowed, 1 token left", r)
    r = q.take(subject + "-tb", cost=2, request_id="upload-2", **bucket)
    show("take", r)
    expect(not r["allowed"] and r["retry_after_ms"] > 0,
           "upload-2 denied with retry_after_ms", r)

    # Concurrency leases: at most 2 jobs at once; a lease is released when done.
    jobs = dict(algorithm="concurrency", limit=2, lease_ms=30000)
    for job in ("job-1", "job-2"):
        r = q.take(subject + "-cc", request_id=job, **jobs)
        show("take", r)
        expect(r["allowed"] and r["lease_ms"] == 30000, job + " granted a lease", r)
    r = q.take(subject + "-cc", request_id="job-3", **jobs)
    show("take", r)
    expect(not r["allowed"], "job-3 denied while 2 leases are held", r)
    r = q.release(subject + "-cc", "job-1", **jobs)
    show("release", r)
    expect(r["released"] and r["used"] == 1, "job-1 released", r)
    r = q.take(subject + "-cc", request_id="job-3", **jobs)
    show("take", r)
    expect(r["allowed"], "job-3 granted after the release", r)
    for job in ("job-2", "job-3"):
        q.release(subject + "-cc", job, **jobs)


def main(argv):
    if len(argv) != 3:
        print("usage: demo.py <socket_path> <subject>", file=sys.stderr)
        return 2
    try:
        with Client(argv[1]) as q:
            run(q, argv[2])
    except Failed as e:
        print("demo failed: %s" % e, file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError, QuotadError) as e:
        print("demo failed: %s: %s" % (type(e).__name__, e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
