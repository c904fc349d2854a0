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

from quotad import Client, ConnectionError, Unavailable

SOCKET = os.environ.get("QUOTAD_SOCKET", "/run/quotad/quotad.sock")
POLICY = os.environ.get("QUOTAD_POLICY", "api")
SUBJECT = os.environ.get("QUOTAD_APP_SUBJECT", "tenant-" + socket.gethostname())
JOBS = int(os.environ.get("QUOTAD_APP_JOBS", "0"))
PAUSE_S = float(os.environ.get("QUOTAD_APP_PAUSE_S", "1"))


def log(**fields):
    print(json.dumps(fields, separators=(",", ":")), flush=True)


def take(client, request_id):
    """One take; on UNAVAILABLE the outcome is unknown, so retry the same id.

    A sidecar restart needs nothing here: the client connects again and
    resends a take that has a request id by itself.
    """
    for attempt in range(5):
        try:
            return client.take(SUBJECT, policy=POLICY, request_id=request_id)
        except Unavailable as e:
            log(event="retry", request_id=request_id, code=e.code, attempt=attempt)
            time.sleep(0.2 * 2 ** attempt)
    raise RuntimeError("quotad stayed unavailable")


def main():
    done = 0
    client = None
    while JOBS == 0 or done < JOBS:
        job = str(uuid.uuid4())
        try:
            if client is None:
                client = Client(SOCKET)
            r = take(client, job)
        except ConnectionError as e:
            # Not there yet (the sidecar starts), or gone for longer than
            # the client's timeout.
            log(event="sidecar unreachable", error=str(e))
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
