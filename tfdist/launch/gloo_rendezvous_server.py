"""Horovod's Gloo rendezvous server, from both sides.

Horovod processes find each other through a small HTTP key-value server that
`horovodrun --gloo` runs (address in HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT).

* Server side, `tfdist-run --horovod`: tfdist-run runs the same server
  (Horovod's own `RendezvousServer`) and gives each rank the environment
  `horovodrun --gloo` would, so the Horovod backend works under tfdist-run
  with its labelled output, timeouts and clean shutdown.
* Client side, `all_gather_strings`: under horovodrun, tfdist's TensorFlow
  transports swap their "host:port" through that store. (Horovod's own
  collectives cannot be used for this: any TensorFlow op would initialize
  TensorFlow's runtime before its collective server can be configured.)
"""

import os
import time

LOOPBACK_INTERFACE = "lo"


def start(num_proc, host):
    """Start the rendezvous server for `num_proc` local ranks.

    Returns (server, [environment additions for rank 0 .. num_proc - 1]).
    """
    try:
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars
        from horovod.runner.http.http_server import RendezvousServer
    except ImportError as e:
        raise RuntimeError(f"--horovod needs Horovod installed (`make install`): {e}") from e
    server = RendezvousServer(verbose=0)
    port = server.start()
    plan = get_host_assignments(parse_hosts(f"localhost:{num_proc}"), num_proc)
    server.init(plan)
    common = {k: str(v) for k, v in
              create_run_env_vars(host, [LOOPBACK_INTERFACE], port).items()}
    return server, [dict(common, **create_slot_env_vars(slot)) for slot in plan]


def all_gather_strings(rank, size, value, timeout, scope="tfdist"):
    """Every rank's `value`, in rank order, through the job's rendezvous store.

    Each rank puts its value under its rank and polls for the others until
    `timeout` seconds have passed; then raises TimeoutError naming the
    missing ranks.
    """
    try:
        address = os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
        port = os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]
    except KeyError:
        raise RuntimeError(
            "tfdist needs Horovod's Gloo rendezvous to exchange addresses under horovodrun: "
            "launch with `horovodrun --gloo`, or use tfdist-run or TF_CONFIG."
        ) from None
    from horovod.runner.http.http_client import put_data_into_kvstore, read_data_from_kvstore

    put_data_into_kvstore(address, port, scope, str(rank), value)
    values = {rank: value}
    deadline = time.monotonic() + timeout
    while len(values) < size:
        for peer in range(size):
            if peer in values:
                continue
            try:
                values[peer] = read_data_from_kvstore(address, port, scope, str(peer))
            except RuntimeError:  # not there yet (404)
                pass
        if len(values) < size:
            if time.monotonic() > deadline:
                missing = sorted(set(range(size)) - set(values))
                raise TimeoutError(
                    f"tfdist rank {rank}: ranks {missing} did not publish their address "
                    f"within the {timeout:g} s timeout."
                )
            time.sleep(0.1)
    return [values[r] for r in range(size)]
