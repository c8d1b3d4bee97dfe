"""Horovod's Gloo rendezvous server, run by `tfdist-run` when Horovod is installed.

Horovod processes find each other through a small HTTP key-value server that
`horovodrun --gloo` runs (address in HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT).
tfdist-run runs the same server (Horovod's own `RendezvousHTTPServer`), bound
to loopback (the job is on this machine), and gives each rank the environment
`horovodrun --gloo` would, so the Horovod backend works under tfdist-run with
its labelled output, timeouts and clean shutdown. Gloo's client sends no
credentials, so this store cannot check the job's secret: it answers any
local process (the docs' Security page). tfdist-run starts it only where
Horovod needs it: not in an MPI job whose Horovod is built with MPI, which
Horovod then runs on.
The ranks' side of the store is `tfdist.comm.gloo_rendezvous`.
"""

import glob
import importlib.util
import os
import threading

LOOPBACK_INTERFACE = "lo"


def installed():
    """True when Horovod can be imported here (found, not imported: no TensorFlow)."""
    return importlib.util.find_spec("horovod") is not None


def built_with_mpi():
    """True when the installed Horovod's TensorFlow extension links an MPI library (it can run
    on MPI in an MPI job, needing no Gloo rendezvous); read from the library file, without
    importing TensorFlow in the launcher."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return False
    for library in glob.glob(os.path.join(spec.submodule_search_locations[0], "tensorflow",
                                          "mpi_lib*.so")):
        try:
            with open(library, "rb") as f:
                if b"libmpi.so" in f.read():
                    return True
        except OSError:
            continue
    return False


def start(num_proc, host, port=0):
    """Start the rendezvous server for `num_proc` local ranks, listening on `host` (an IP:
    loopback for a job on one machine) at `port` (0: a free one).

    Returns (server, [environment additions for rank 0 .. num_proc - 1]); `server.shutdown()`
    stops it. Horovod's own `RendezvousServer.start` listens on every interface: the same
    server class is bound here where the ranks are.
    """
    try:
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
    except ImportError as e:
        raise RuntimeError(
            f"--horovod needs Horovod, which is not installed ({e}). It is optional: without "
            "--horovod the job runs on TensorFlow's collectives. To add it, from a clone of "
            "tfdist: scripts/install_horovod.sh \"$(which python)\" (needs cmake and g++, about "
            "4 minutes once), or `make install` in the clone.") from e
    server = RendezvousHTTPServer((host, port), RendezvousHandler, 0)
    threading.Thread(target=server.serve_forever, name="tfdist-gloo-rendezvous",
                     daemon=True).start()
    plan = get_host_assignments(parse_hosts(f"localhost:{num_proc}"), num_proc)
    server.init(plan)
    common = {k: str(v) for k, v in
              create_run_env_vars(host, [LOOPBACK_INTERFACE], server.server_address[1]).items()}
    return server, [dict(common, **create_slot_env_vars(slot)) for slot in plan]
