"""A worker that takes quota from its pod's quotad sidecar before each job.

It stands for any application in the pod: it knows nothing about Redis,
only the socket (QUOTAD_SOCKET) and a policy name (QUOTAD_POLICY). Each
"job" is one take with a request id, so a retry after a lost reply never
takes twice. It prints one JSON line per job for `kubectl logs`.

QUOTAD_APP_JOBS limits the number of jobs (0, the default, runs forever).
"""

import json
import os
import socket
import sys
import time
import uuid

from quotad import Client, QuotadError

SOCKET = os.environ.get("QUOTAD_SOCKET", "/run/quotad/quotad.sock")
POLICY = os.environ.get("QUOTAD_POLICY", "api")
SUBJECT = os.environ.get("QUOTAD_APP_SUBJECT", "tenant-" + socket.gethostname())
JOBS = int(os.environ.get("QUOTAD_APP_JOBS", "0"))
PAUSE_S = float(os.environ.get("QUOTAD_APP_PAUSE_S", "1"))


def log(**fields):
    print(json.dumps(fields, separators=(",", ":")), flush=True)


def take(client, request_id):
    """One take; on UNAVAILABLE the outcome is unknown, so retry the same id."""
    for attempt in range(5):
        try:
            return client.take(SUBJECT, policy=POLICY, request_id=request_id)
        except QuotadError as e:
            if e.code not in ("UNAVAILABLE", "SHUTTING_DOWN"):
                raise
            log(event="retry", request_id=request_id, code=e.code, attempt=attempt)
            time.sleep(0.2 * 2 ** attempt)
    raise RuntimeError("quotad stayed unavailable")


def main():
    done = 0
    client = None
    while JOBS == 0 or done < JOBS:
        if client is None:
            client = Client(SOCKET)
        job = str(uuid.uuid4())
        try:
            r = take(client, job)
        except (OSError, ValueError) as e:
            # The connection is closed on any I/O error; open a new one.
            log(event="sidecar unreachable", error=str(e))
            client = None
            time.sleep(PAUSE_S)
            continue
        if r["allowed"]:
            log(event="job done", job=job, used=r["used"], limit=r["limit"], shadow=r.get("shadow", False))
        else:
            log(event="over quota", job=job, retry_after_ms=r["retry_after_ms"])
        done += 1
        time.sleep(PAUSE_S)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
