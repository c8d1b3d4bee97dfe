"""Process-wide state: this process's cluster, its communicators, and their shutdown.

A TensorFlow server can be started once per process, and Horovod initialized
once, so each communicator is created once (on first use) and shared by every
strategy the process builds. Kept apart from the user-facing strategies, as
HF Accelerate keeps `state.py` apart from `accelerator.py`.

Shutdown is explicit and in one place (`shutdown`, run once at interpreter
exit, before any teardown): first every communicator stops watching its
peers (at the end of a job peers exit seconds apart, which is no failure),
then the resources registered with `close_at_exit` (a parameter-server
client saying goodbye, a co-located server process being waited for) are
closed, last registered first, then the communicators.

Engines:
  "collective"  TensorFlow collective ops over gRPC (`tfdist.comm.tf_collective`);
                needs every worker's "host:port": given by tfdist-run and
                TF_CONFIG, exchanged through Horovod under horovodrun.
  "horovod"     Horovod's ops (`tfdist.comm.horovod`); needs a process started
                by horovodrun or `tfdist-run --horovod`.
"""

import atexit
import dataclasses
import os
import socket
import threading

from absl import logging

from tfdist import cluster as cluster_lib

ENGINES = ("collective", "horovod")

_lock = threading.RLock()
_cluster = None
_communicators = {}
_single_process = None
_closables = []  # closed by `shutdown`, last registered first


def cluster():
    """This process's `tfdist.cluster.Cluster` (discovered once)."""
    global _cluster
    with _lock:
        if _cluster is None:
            _cluster = cluster_lib.discover()
        return _cluster


def launched_with_horovod():
    """True when Horovod knows this process's peers (horovodrun or tfdist-run --horovod)."""
    return "HOROVOD_RANK" in os.environ and "HOROVOD_SIZE" in os.environ


def communicator(engine="collective", fusion_threshold_bytes=None):
    """The process-wide `tfdist.comm.base.Communicator` on `engine`.

    With one training process it is the `SingleProcessCommunicator`, whatever
    the engine. `fusion_threshold_bytes` configures Horovod's fusion buffer
    when this call initializes Horovod (ignored otherwise).
    """
    global _single_process
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}. Got: {engine!r}")
    spec = cluster()
    with _lock:
        if spec.world_size == 1:
            if _single_process is None:
                from tfdist.comm.single_process import SingleProcessCommunicator

                _single_process = SingleProcessCommunicator()
            return _single_process
        if engine not in _communicators:
            _communicators[engine] = (
                _start_horovod(spec, fusion_threshold_bytes) if engine == "horovod"
                else _start_collective(spec)
            )
            _register_shutdown()
        return _communicators[engine]


def close_at_exit(resource):
    """Have `shutdown` call `resource.close()` (after the peers are no longer watched)."""
    with _lock:
        _closables.append(resource)
        _register_shutdown()
    return resource


_shutdown_registered = [False]


def _register_shutdown():
    if not _shutdown_registered[0]:
        _shutdown_registered[0] = True
        atexit.register(shutdown)


def shutdown():
    """Stop watching peers, close the registered resources (newest first), then the communicators.

    Idempotent. A resource whose `close()` fails is logged and the others
    are still closed.
    """
    with _lock:
        communicators = list(_communicators.values())
        closables = list(reversed(_closables))
        _closables.clear()
    for each in communicators:
        each.stop_watching()
    for resource in closables + communicators:
        try:
            resource.close()
        except Exception as e:  # pylint: disable=broad-except
            logging.warning("tfdist: closing %s failed: %s", type(resource).__name__, e)


def _start_horovod(spec, fusion_threshold_bytes):
    if not launched_with_horovod():
        raise RuntimeError(
            f"tfdist rank {spec.rank}: the Horovod engine needs processes started by "
            "horovodrun or `tfdist-run --horovod` (launched here by "
            f"{spec.launcher}); use backend='collective' or change the launcher."
        )
    from tfdist.comm.horovod import HorovodCommunicator

    return HorovodCommunicator(spec, fusion_threshold_bytes)


def _start_collective(spec):
    global _cluster
    from tfdist.comm.tf_collective import CollectiveCommunicator

    if not spec.worker_addresses:
        if not launched_with_horovod():
            raise RuntimeError(
                f"tfdist rank {spec.rank}: launched by {spec.launcher} without worker "
                "addresses; TensorFlow collectives need them (use tfdist-run, TF_CONFIG "
                "or horovodrun)."
            )
        spec = _cluster = dataclasses.replace(
            spec, worker_addresses=_exchange_addresses_through_horovod(spec)
        )
    return CollectiveCommunicator(spec)


def _exchange_addresses_through_horovod(spec):
    """Under horovodrun: each rank picks a free port and all ranks swap "host:port".

    The host is the name horovodrun gave this slot (reachable by the peers,
    since horovodrun itself reached it), else this machine's host name.
    """
    from tfdist.comm.gloo_rendezvous import all_gather_strings
    from tfdist.comm.ports import pick_ports

    host = os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()
    port = pick_ports(1, host="")[0]
    return tuple(all_gather_strings(spec.rank, spec.world_size, f"{host}:{port}",
                                    spec.timeout, scope="tfdist-worker-addresses"))
