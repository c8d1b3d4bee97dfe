"""Worker script for launcher tests (no TensorFlow, starts fast).

Behaviour by argument:
  env              print this process's TFDIST_* environment as JSON, exit 0
  env MARKER       the same, but a server then creates MARKER and waits to be stopped, and
                   workers exit only once MARKER exists (tfdist-run stops the servers when
                   the workers are done: without this, a server slower to start than the
                   workers could be stopped before it printed)
  fail RANK CODE   rank RANK exits with CODE after 0.5 s; others sleep 600 s
  fail-until N     print the TFDIST_* environment as JSON; then, while TFDIST_RESTART_COUNT < N,
                   rank 1 exits with code 7 after 0.5 s and the others sleep 600 s; from the
                   N-th restart on every rank exits 0
  orphan PIDFILE   spawn a grandchild `sleep 600`, append its pid to PIDFILE, sleep 600 s
  elastic DONE     print the TFDIST_* environment and the pid as JSON; then, as a rank of a
                   fit with a backup would, exit 42 once an elastic tfdist-run requests a
                   resize, or 0 once the file DONE exists (3 after 120 s)
"""

import json
import os
import subprocess
import sys
import time

mode = sys.argv[1]
rank = int(os.environ.get("TFDIST_RANK", "-1"))

if mode == "env":
    print(json.dumps({k: v for k, v in os.environ.items() if k.startswith("TFDIST_")}), flush=True)
    if len(sys.argv) > 2:
        marker = sys.argv[2]
        if os.environ.get("TFDIST_ROLE") == "server":
            open(marker, "w").close()
            time.sleep(600)
        deadline = time.monotonic() + 60
        while not os.path.exists(marker):
            if time.monotonic() > deadline:
                sys.exit("launcher_probe: the server never started")
            time.sleep(0.05)
elif mode == "fail":
    failing_rank, code = int(sys.argv[2]), int(sys.argv[3])
    if rank == failing_rank:
        time.sleep(0.5)
        print("failing on purpose", flush=True)
        sys.exit(code)
    time.sleep(600)
elif mode == "fail-until":
    print(json.dumps({k: v for k, v in os.environ.items() if k.startswith("TFDIST_")}), flush=True)
    if int(os.environ.get("TFDIST_RESTART_COUNT", "0")) < int(sys.argv[2]):
        if rank == 1:
            time.sleep(0.5)
            sys.exit(7)
        time.sleep(600)
elif mode == "orphan":
    child = subprocess.Popen(["sleep", "600"])
    with open(sys.argv[2], "a") as f:
        f.write(f"{child.pid}\n{os.getpid()}\n")
    time.sleep(600)
elif mode == "elastic":
    from tfdist.fault_tolerance import elastic_channel

    state = {k: v for k, v in os.environ.items() if k.startswith("TFDIST_")}
    print(json.dumps(dict(state, pid=os.getpid())), flush=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        reason = elastic_channel.requested_resize()
        if reason:
            print(f"took {reason}", flush=True)
            sys.exit(42)
        if os.path.exists(sys.argv[2]):
            sys.exit(0)
        time.sleep(0.05)
    sys.exit(3)
