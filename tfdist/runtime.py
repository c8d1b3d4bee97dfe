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

A thread can be bound to a communicator it was given (`use_communicator`):
`cluster()` and `communicator()` then answer for that rank, so P strategies
built in P threads of one process train together (the simulated engine of
`tfdist.comm.simulated`, which the in-process test tier uses).

Engines: the registry `tfdist.comm.engines` (what each is, needs and costs);
`communicator` starts the one a strategy names, once per process.
"""

import atexit
import contextlib
import dataclasses
import os
import socket
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Tuple, TypeVar

from absl import logging

from tfdist import env_vars
from tfdist.env_vars import Foreign
from tfdist.process_setup import cluster as cluster_lib
from tfdist.process_setup import job_secret
from tfdist.process_setup import cpu_share, gpu_placement
from tfdist.process_setup import quiet_output

if TYPE_CHECKING:
    from tfdist.comm.base import Communicator
    from tfdist.comm.ports import PortReservation
    from tfdist.comm.rank_agreement import Agreement

Closable = TypeVar("Closable")

_lock = threading.RLock()
_cluster: Optional[cluster_lib.Cluster] = None
_communicators: Dict[str, "Communicator"] = {}
_single_process: Optional["Communicator"] = None
_closables: List[Any] = []  # closed by `shutdown`, last registered first
_held_port: Optional["PortReservation"] = None  # this rank's swapped port, until its server binds
_agreement: Optional["Agreement"] = None  # what the ranks agreed at start-up (`job_agreement`)
_bound = threading.local()  # .communicator, .cluster: a thread bound by `use_communicator`


def bound_to_communicator() -> bool:
    """True in a thread bound by `use_communicator` (a simulated rank)."""
    return getattr(_bound, "communicator", None) is not None


@contextlib.contextmanager
def use_communicator(communicator: "Communicator",
                     launcher: str = "simulated") -> Iterator[cluster_lib.Cluster]:
    """In this thread, `cluster()` is `communicator`'s rank and `communicator()` is it.

    For ranks that are threads of one process (`tfdist.comm.simulated`):
    strategies built inside the block use `communicator` whatever engine
    they name, and the process-wide cluster and communicators are neither
    discovered nor started. Bindings do not nest.
    """
    if getattr(_bound, "communicator", None) is not None:
        raise RuntimeError("tfdist: this thread is already bound to a communicator")
    _bound.communicator = communicator
    _bound.cluster = cluster_lib.Cluster(rank=communicator.rank,
                                         world_size=communicator.world_size,
                                         launcher=launcher,
                                         local_size=communicator.world_size)  # one process
    try:
        yield _bound.cluster
    finally:
        _bound.communicator = _bound.cluster = None


def cluster() -> cluster_lib.Cluster:
    """This process's `tfdist.process_setup.cluster.Cluster` (discovered once; a bound thread's rank)."""
    global _cluster
    if getattr(_bound, "cluster", None) is not None:
        return _bound.cluster
    with _lock:
        if _cluster is None:
            _cluster = cluster_lib.discover()
            quiet_output.after_discovery(_cluster)
            cpu_share.share_cpus(_cluster)
            gpu_placement.place(_cluster)  # before anything starts TensorFlow's runtime
        return _cluster


def job_agreement() -> "Agreement":
    """What every rank of this job agreed at start-up (`tfdist.comm.rank_agreement`): the
    engines all of them can run, and the job's secret. Settled once per process, through the
    launcher's channel, the first time a strategy asks (every rank builds its strategy);
    versions that differ across ranks fail here, naming the ranks."""
    global _agreement
    with _lock:
        if _agreement is None:
            _agreement = _agree()
        return _agreement


def _agree() -> "Agreement":
    from tfdist.comm import rank_agreement

    from tfdist.comm import engines as engine_registry

    spec = cluster()
    engines, missing = engine_registry.runnable(spec)
    channel = None if bound_to_communicator() or spec.world_size == 1 else _agreement_channel(spec)
    if channel is None:  # one process, simulated ranks, or no choice to agree on
        return rank_agreement.Agreement(engines, {}, None)
    share_secret = (spec.rank == 0 and channel.carries_secrets
                    and not env_vars.SECRET.get())
    mine = rank_agreement.proposal(engines, missing, _versions(),
                                   job_secret.new_secret() if share_secret else None)
    agreement = rank_agreement.settle(spec.rank, channel(mine))
    if agreement.secret and not env_vars.SECRET.get():
        os.environ[env_vars.SECRET.name] = agreement.secret  # children inherit it too
    return agreement


class _Channel:
    """An all-gather of proposals through the launcher (`tfdist.comm.launcher_channel`)."""

    def __init__(self, gather: Callable[[str], List[str]], carries_secrets: bool):
        self._gather = gather
        self.carries_secrets = carries_secrets  # MPI: the launcher authenticated its ranks

    def __call__(self, text: str) -> List[str]:
        return self._gather(text)


def _agreement_channel(spec: cluster_lib.Cluster) -> Optional[_Channel]:
    from tfdist.comm import engines, launcher_channel
    from tfdist.comm.rank_agreement import check_proposal

    what = "the ranks' start-up agreement (engines, versions)"
    if engines.launched_as_mpi_job(spec):
        return _Channel(lambda text: launcher_channel.gather_through_mpi(
            spec.rank, spec.world_size, text, spec.timeout, check_proposal, what), True)
    address = Foreign.HOROVOD_GLOO_RENDEZVOUS_ADDR.get()
    port = Foreign.HOROVOD_GLOO_RENDEZVOUS_PORT.get()
    if address and port:  # horovodrun, tfdist-run with Horovod: Gloo's store
        scope = f"tfdist-agreement-{env_vars.RESTART_COUNT.get() or 0}"
        return _Channel(lambda text: launcher_channel.gather_through_store(
            spec.rank, spec.world_size, text, spec.timeout, (address, port), scope,
            check_proposal, what), False)
    return None


def _versions() -> Dict[str, str]:
    import keras
    import tensorflow as tf

    import tfdist

    return {"tfdist": tfdist.__version__, "tensorflow": tf.__version__,
            "keras": keras.__version__}


def mpi_engine_runs() -> bool:
    """True when every rank of this job can run the MPI engine (`job_agreement`)."""
    from tfdist.comm import engines

    return engines.MPI in job_agreement().engines


def communicator(engine: str = "collective", **options: Any) -> "Communicator":
    """The process-wide `tfdist.comm.base.Communicator` on `engine` (`tfdist.comm.engines`).

    With one training process it is the `SingleProcessCommunicator`, whatever the engine.
    `options` are those `Engine.options` gives for the strategy's settings: they start the
    engine on the first call (Horovod's fusion buffer), and a later call's are applied to
    the started one where the engine allows (the collective engine's implementation: the
    latest call's stands).
    """
    global _single_process
    from tfdist.comm import engines

    registered = engines.engine(engine)  # an unknown name fails here, naming the known ones
    if getattr(_bound, "communicator", None) is not None:
        return _bound.communicator
    spec = cluster()
    with _lock:
        if spec.world_size == 1:
            if _single_process is None:
                from tfdist.comm.single_process import SingleProcessCommunicator

                _single_process = SingleProcessCommunicator()
            return _single_process
        if engine not in _communicators:
            job_agreement()  # the ranks' versions and secret, before any engine starts
            refusal = registered.refusal(spec)
            if refusal:
                raise RuntimeError(refusal)
            held_port = None
            if registered.needs_worker_addresses:
                spec = _with_worker_addresses(spec)
                held_port = _take_held_port(spec)
            _communicators[engine] = registered.start(spec, held_port, options)
            _register_shutdown()
        elif registered.configure is not None:
            registered.configure(_communicators[engine], options)
        return _communicators[engine]


def close_at_exit(resource: Closable) -> Closable:
    """Have `shutdown` call `resource.close()` (after the peers are no longer watched)."""
    with _lock:
        _closables.append(resource)
        _register_shutdown()
    return resource


_shutdown_registered = [False]


def _register_shutdown() -> None:
    if not _shutdown_registered[0]:
        _shutdown_registered[0] = True
        atexit.register(shutdown)


def shutdown() -> None:
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


def _with_worker_addresses(spec: cluster_lib.Cluster) -> cluster_lib.Cluster:
    """`spec` with every worker's "host:port" (swapped with the other ranks where the launcher
    gave none), kept as this process's cluster."""
    global _cluster
    if not spec.worker_addresses:
        spec = _cluster = dataclasses.replace(
            spec, worker_addresses=_exchange_addresses(spec)
        )
    return spec


def _take_held_port(spec: cluster_lib.Cluster) -> "PortReservation":
    """This rank's port of the job's worker addresses, held until its server binds it: the one
    this process reserved for the address exchange, else a hold of its own beside the
    launcher's (`tfdist.comm.ports`)."""
    global _held_port
    from tfdist.comm import ports

    held, _held_port = _held_port, None
    if held is not None:
        return held
    address = spec.worker_addresses[spec.rank]
    port = int(address.rsplit(":", 1)[1])
    try:
        return ports.PortReservation(ports.listen_address(spec.on_one_host), port)
    except OSError as error:
        from tfdist.errors import ClusterError

        raise ClusterError(
            f"tfdist rank {spec.rank}: cannot listen on {address}: port {port} is already in "
            f"use ({error}; another job, or a stale process?).") from None


def _exchange_addresses(spec: cluster_lib.Cluster) -> Tuple[str, ...]:
    """Under horovodrun, mpirun and srun: hold a free port where this rank listens and swap
    "host:port" with every rank.

    The host is loopback when every rank runs on this machine; else TFDIST_HOST if set, the
    address of TFDIST_NETWORK_INTERFACE if named, else the name the launcher gave this slot
    (reachable by the peers: horovodrun's -H name, Slurm's node name), else this machine's
    host name (`tfdist.comm.ports.advertised_host`). The port comes from TFDIST_PORT_RANGE
    when set, and stays held until this rank's server binds it (`_take_held_port`).
    """
    global _held_port
    from tfdist.comm import ports
    from tfdist.comm.address_exchange import exchange_worker_addresses

    host = spec.host or socket.gethostname()
    if spec.launcher == "horovodrun":
        host = spec.host or Foreign.HOROVOD_HOSTNAME.get() or socket.gethostname()
    spec = dataclasses.replace(spec, host=ports.advertised_host(spec.on_one_host, host))
    _held_port = ports.reserve_ports(1, ports.listen_address(spec.on_one_host, spec.host),
                                     port_range=ports.job_port_range())[0]
    return tuple(exchange_worker_addresses(spec, _held_port.port))
