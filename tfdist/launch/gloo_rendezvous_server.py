"""Horovod's Gloo rendezvous server, run by `tfdist-run` when Horovod is installed.

Horovod processes find each other through a small HTTP key-value server that
`horovodrun --gloo` runs (address in HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT).
tfdist-run runs the same server (Horovod's own `RendezvousServer`) and gives
each rank the environment `horovodrun --gloo` would, so the Horovod backend
works under tfdist-run with its labelled output, timeouts and clean shutdown.
The ranks' side of the store is `tfdist.comm.gloo_rendezvous`.
"""

import importlib.util

LOOPBACK_INTERFACE = "lo"


def installed():
    """True when Horovod can be imported here (found, not imported: no TensorFlow)."""
    return importlib.util.find_spec("horovod") is not None


def start(num_proc, host):
    """Start the rendezvous server for `num_proc` local ranks.

    Returns (server, [environment additions for rank 0 .. num_proc - 1]).
    """
    try:
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars
        from horovod.runner.http.http_server import RendezvousServer
    except ImportError as e:
        raise RuntimeError(
            f"--horovod needs Horovod, which is not installed ({e}). It is optional: without "
            "--horovod the job runs on TensorFlow's collectives. To add it, from a clone of "
            "tfdist: scripts/install_horovod.sh \"$(which python)\" (needs cmake and g++, about "
            "4 minutes once), or `make install` in the clone.") from e
    server = RendezvousServer(verbose=0)
    port = server.start()
    plan = get_host_assignments(parse_hosts(f"localhost:{num_proc}"), num_proc)
    server.init(plan)
    common = {k: str(v) for k, v in
              create_run_env_vars(host, [LOOPBACK_INTERFACE], port).items()}
    return server, [dict(common, **create_slot_env_vars(slot)) for slot in plan]
