"""The engines that move a job's bytes, each registered once: what it is, what it needs, how fast.

An engine is one module with a `tfdist.comm.base.Communicator` (`comm/tf_collective.py`,
`comm/horovod.py`, `comm/mpi.py`) and one `register(Engine(...))` here, as a third-party
collective library registers itself with torch's `Backend.register_backend`. Everything
else reads `ENGINES`: the strategies' `backend` values, `runtime.communicator`'s start, the
ranks' start-up agreement on what each can run, `backend="auto"`'s choice by measured
curves, the cost model's engines, the start-up line's label. No other list names them.

Engines, and what a job needs to run each:

* "mpi"          Open MPI's own collectives from compiled TensorFlow ops (`tfdist.comm.mpi`),
                 the processes started as one MPI job: mpirun, `horovodrun --mpi`, plain
                 tfdist-run where Open MPI is installed (`tfdist.launch.mpi_job`), srun with
                 PMIx;
* "horovod"      Horovod's ops (`tfdist.comm.horovod`) on the controller its launcher set up:
                 "horovod-mpi" (Horovod built with MPI, started by mpirun or `horovodrun
                 --mpi`), "horovod-gloo" (started by horovodrun, or tfdist-run with Horovod
                 installed);
* "collective"   TensorFlow's collectives over its gRPC runtime (`tfdist.comm.tf_collective`):
                 every job; needs every worker's "host:port" (given by tfdist-run, TF_CONFIG
                 and Kubernetes, swapped under horovodrun, mpirun and srun:
                 `tfdist.comm.address_exchange`).

A job runs an engine over one `Transport` (Horovod has two, each of the others one): the
unit the ranks agree on, the start-up line names and the measured curves price.

`choose` ("auto"): among the transports every rank can run, the one with the least measured
time per all-reduce at the job's bucket size (`fusion_threshold_bytes`: the bucket every
large model's gradient fills), from each transport's `over_tf_ring`: its time over
TensorFlow's ring measured in the same processes (`tfdist-bench --only engines`, 2
processes on one host, benchmarks/results/engine_curves.json; a test keeps the curves equal
to that file's summary, so a re-run that changes the order changes the choice). The MPI
engine is the fastest at every size measured, then Horovod's, then the gRPC ring, so "auto"
takes the MPI engine in an MPI job, else Horovod whenever the launcher gave Horovod its
peers; a launcher that did neither (srun without PMIx, TF_CONFIG, Ray, Kubernetes) leaves
the ring. The strategy's start-up line says which it took and why; with TFDIST_VERBOSE=1
also what the faster ones would need (`faster_engines`).

Cost: table lookups at strategy construction; nothing per step. TensorFlow-free at import
(the launcher reads it): each engine's module is imported when it starts.
"""

import bisect
import dataclasses
from typing import TYPE_CHECKING, Callable, Dict, Iterable, Mapping, Optional, Tuple

from tfdist.env_vars import Foreign

if TYPE_CHECKING:
    from tfdist.comm.base import Communicator
    from tfdist.comm.ports import PortReservation
    from tfdist.process_setup.cluster import Cluster

# The transports' labels.
COLLECTIVE = "collective"
HOROVOD_MPI = "horovod-mpi"
HOROVOD_GLOO = "horovod-gloo"
MPI = "mpi"


@dataclasses.dataclass(frozen=True)
class Transport:
    """One way a job runs an engine: the label the ranks agree on and the start-up line says.

    Attributes:
        label: "mpi", "horovod-mpi", "horovod-gloo", "collective".
        over_tf_ring: measured all-reduce time over TensorFlow's ring, per payload in bytes
            (medians over rounds); empty for the ring itself (1.0 at every size).
        needs: what a job needs to run it (said when a faster one is not available).
    """
    label: str
    over_tf_ring: Mapping[int, float]
    needs: str

    def relative_time(self, nbytes: int) -> float:
        """The curve's value at the largest measured size <= nbytes (the smallest below it)."""
        if not self.over_tf_ring:
            return 1.0
        sizes = sorted(self.over_tf_ring)
        return self.over_tf_ring[sizes[max(bisect.bisect_right(sizes, nbytes) - 1, 0)]]


@dataclasses.dataclass(frozen=True)
class Engine:
    """What an engine is, for everything that is not its communicator.

    Attributes:
        name: the strategies' `backend` value.
        transports: the ways a job runs it, fastest first.
        runs: (labels this process can run, {label: why it cannot}) for its cluster.
        refusal: why a process of this cluster cannot start it (None: it can), raised as
            the start's error before any port is taken.
        start: (cluster, this rank's held port or None, options) -> its communicator; the
            cluster carries every worker's address when `needs_worker_addresses`.
        options: the strategy's (fusion_threshold_bytes, implementation) -> the options it
            takes (`runtime.communicator`'s keyword arguments).
        configure: a later strategy's options applied to the started communicator, or None.
        label: the transport this process runs it over (the start-up line).
        needs_worker_addresses: every worker's "host:port" before it starts (a gRPC server
            or a liveness port per rank).
        reduces_scatter: its communicator has `reduce_scatter` (static twin of
            `Communicator.reduces_scatter`, for the cost model before any start).
        point_to_point: its communicator has `send` / `recv`.
    """
    name: str
    transports: Tuple[Transport, ...]
    runs: Callable[["Cluster"], Tuple[Tuple[str, ...], Dict[str, str]]]
    refusal: Callable[["Cluster"], Optional[str]]
    start: Callable[["Cluster", Optional["PortReservation"], dict], "Communicator"]
    options: Callable[[int, str], dict] = lambda fusion_threshold_bytes, implementation: {}
    configure: Optional[Callable[["Communicator", dict], None]] = None
    label: Optional[Callable[["Cluster"], str]] = None
    needs_worker_addresses: bool = False
    reduces_scatter: bool = False
    point_to_point: bool = False

    def label_for(self, cluster: "Cluster") -> str:
        return self.label(cluster) if self.label is not None else self.transports[0].label


ENGINES: Dict[str, Engine] = {}  # in registration order: the agreement's order
TRANSPORTS: Dict[str, Transport] = {}
_ENGINE_OF: Dict[str, str] = {}  # transport label -> engine name


def register(engine: Engine) -> Engine:
    """Make `engine` a `backend` value, startable, agreed on, priced and chosen by "auto"."""
    if engine.name in ENGINES:
        raise ValueError(f"tfdist: an engine named {engine.name!r} is registered already")
    ENGINES[engine.name] = engine
    for transport in engine.transports:
        TRANSPORTS[transport.label] = transport
        _ENGINE_OF[transport.label] = engine.name
    return engine


def engine(name: str) -> Engine:
    """The registered engine `name`; a clear error naming the registered ones otherwise."""
    if name not in ENGINES:
        raise ValueError(f"engine must be one of {tuple(ENGINES)}. Got: {name!r}")
    return ENGINES[name]


def names(**capabilities: bool) -> Tuple[str, ...]:
    """The registered engines' names with every given capability (`reduces_scatter=True`,
    `point_to_point=True`), in registration order."""
    return tuple(name for name, each in ENGINES.items()
                 if all(getattr(each, cap) == wanted for cap, wanted in capabilities.items()))


# --- what a process can run, from its launcher ---------------------------------------------

def launched_as_mpi_job(cluster: "Cluster") -> bool:
    """True when this process is one of an MPI job's processes (its MPI_COMM_WORLD is the
    job): started by Open MPI's mpirun (also under `horovodrun --mpi` and `tfdist-run --mpi`),
    or by srun with PMIx (`srun --mpi=pmix`)."""
    if cluster.launcher == "mpirun":
        return True
    if cluster.launcher == "tfdist-run":  # `tfdist-run --mpi`: mpirun's rank is tfdist-run's
        return (Foreign.OMPI_COMM_WORLD_RANK.get() == str(cluster.rank)
                and Foreign.OMPI_COMM_WORLD_SIZE.get() == str(cluster.world_size))
    return cluster.launcher == "srun" and Foreign.PMIX_RANK.is_set()


def launched_with_horovod(cluster: "Cluster") -> bool:
    """True when Horovod knows this process's peers.

    That is: started by horovodrun or tfdist-run with Horovod installed (Gloo), or as one
    MPI job (mpirun - `horovodrun --mpi` runs mpirun -, tfdist-run's mpirun, srun with PMIx)
    with a Horovod built with MPI.
    """
    if Foreign.HOROVOD_RANK.is_set() and Foreign.HOROVOD_SIZE.is_set():
        return True
    if not launched_as_mpi_job(cluster):
        return False
    from tfdist.comm.horovod import horovod_mpi_built

    return horovod_mpi_built()


def horovod_controller(cluster: "Cluster") -> Optional[str]:
    """The controller the launcher set up for Horovod (Horovod's own word, HOROVOD_CONTROLLER):
    "gloo" (horovodrun, `tfdist-run --horovod`: a Gloo rendezvous, or
    HOROVOD_CPU_OPERATIONS=gloo), "mpi" (mpirun with a Horovod built with MPI), or None when
    Horovod does not know this process's peers."""
    if not launched_with_horovod(cluster):
        return None
    if (Foreign.HOROVOD_GLOO_RENDEZVOUS_ADDR.is_set()
            or Foreign.HOROVOD_CPU_OPERATIONS.get(default="").lower() == "gloo"):
        return "gloo"
    return "mpi"


def runnable(cluster: "Cluster") -> Tuple[Tuple[str, ...], Dict[str, str]]:
    """(transports this process can run, {transport: why not}), every engine asked in
    registration order: this rank's proposal to the start-up agreement."""
    labels: Tuple[str, ...] = ()
    missing: Dict[str, str] = {}
    for each in ENGINES.values():
        can, cannot = each.runs(cluster)
        labels += can
        missing.update(cannot)
    return labels, missing


# --- the choice ("auto") ---------------------------------------------------------------------

def relative_time(label: str, nbytes: int) -> float:
    """Transport `label`'s measured all-reduce time over TensorFlow's ring at `nbytes` buckets."""
    return TRANSPORTS[label].relative_time(nbytes)


def choose(available: Iterable[str], nbytes: int) -> Tuple[str, str]:
    """(transport, why): the available transport of least measured time for a bucket of
    `nbytes`, and the reason the strategy's start-up line gives for it."""
    available = tuple(available)
    label = min(available, key=lambda each: relative_time(each, nbytes))
    if len(available) == 1:
        return label, "the one engine this job can run"
    return label, (f"the fastest engine this job can run, {relative_time(label, nbytes):.2f}x "
                   f"TensorFlow's ring time at {nbytes / 2**20:g} MiB buckets")


def faster_engines(available: Iterable[str], nbytes: int) -> str:
    """The transports faster than `choose`'s that this job cannot run, and what each needs
    ("" if none): said at start-up with TFDIST_VERBOSE=1, and in docs/strategies.md."""
    available = tuple(available)
    chosen = relative_time(choose(available, nbytes)[0], nbytes)
    faster = [each for each in TRANSPORTS.values()
              if each.label not in available and each.relative_time(nbytes) < chosen]
    return ", ".join(f"{each.label} ({each.relative_time(nbytes):.2f}x; needs {each.needs})"
                     for each in faster)


def engine_of(label: str) -> str:
    """The engine (the strategy's `backend` value) that runs transport `label`."""
    return _ENGINE_OF[label]


# --- the three engines -------------------------------------------------------------------------
# Curves: benchmarks/results/engine_curves.json "summary" "over_tf_ring" (there "mpi_engine",
# "mpi" and "gloo").

def _mpi_runs(cluster):
    if cluster.world_size == 1 or not launched_as_mpi_job(cluster):
        return (), {}
    from tfdist.comm.mpi import unavailable_reason

    reason = unavailable_reason(cluster)
    return ((), {MPI: reason.splitlines()[0]}) if reason else ((MPI,), {})


def _mpi_refusal(cluster):
    if launched_as_mpi_job(cluster):
        return None
    return (f"tfdist rank {cluster.rank}: the MPI engine needs the processes started as one MPI "
            "job: by mpirun, horovodrun --mpi, tfdist-run --mpi or srun --mpi=pmix (launched "
            f"here by {cluster.launcher}); use backend='collective' or change the launcher.")


def _start_mpi(cluster, held_port, options):
    from tfdist.comm.mpi import MpiCommunicator

    return MpiCommunicator(cluster, held_port)


register(Engine(
    name="mpi",
    transports=(Transport(MPI, {4096: 0.336, 16384: 0.287, 65536: 0.345, 262144: 0.318,
                                1048576: 0.277, 4194304: 0.209, 16777216: 0.212,
                                67108864: 0.285},
                          "Open MPI and a start as one MPI job: tfdist-run, mpirun or "
                          "srun --mpi=pmix"),),
    runs=_mpi_runs, refusal=_mpi_refusal, start=_start_mpi,
    needs_worker_addresses=True,  # each rank's liveness port
    reduces_scatter=True))


def _horovod_runs(cluster):
    from tfdist.comm.horovod import horovod_available

    if cluster.world_size == 1 or not launched_with_horovod(cluster):
        return (), {}
    if not horovod_available():
        return (), {HOROVOD_GLOO: "Horovod does not import here"}
    return (f"horovod-{horovod_controller(cluster)}",), {}


def _horovod_refusal(cluster):
    if launched_with_horovod(cluster):
        return None
    return (f"tfdist rank {cluster.rank}: the Horovod engine needs processes started by "
            "horovodrun, tfdist-run (without --no-horovod, with Horovod installed), or mpirun "
            "with a Horovod built with MPI (launched here by "
            f"{cluster.launcher}); use backend='collective' or change the launcher.")


def _start_horovod(cluster, held_port, options):
    from tfdist.comm.horovod import HorovodCommunicator

    return HorovodCommunicator(cluster, options.get("fusion_threshold_bytes"))


def _horovod_label(cluster):
    controller = horovod_controller(cluster)
    return f"horovod-{controller}" if controller else "horovod"


register(Engine(
    name="horovod",
    transports=(
        Transport(HOROVOD_MPI, {4096: 0.412, 16384: 0.365, 65536: 0.413, 262144: 0.384,
                                1048576: 0.326, 4194304: 0.305, 16777216: 0.248,
                                67108864: 0.691},
                  "Horovod built with MPI and a start by mpirun or horovodrun --mpi"),
        Transport(HOROVOD_GLOO, {4096: 0.914, 16384: 0.899, 65536: 1.23, 262144: 1.066,
                                 1048576: 1.238, 4194304: 0.645, 16777216: 0.574,
                                 67108864: 0.548},
                  "Horovod and a start by horovodrun or tfdist-run")),
    runs=_horovod_runs, refusal=_horovod_refusal, start=_start_horovod,
    # Horovod's fusion buffer is the strategy's bucket (HOROVOD_FUSION_THRESHOLD), set when
    # this call initializes Horovod.
    options=lambda fusion_threshold_bytes, implementation: {
        "fusion_threshold_bytes": fusion_threshold_bytes},
    label=_horovod_label,
    reduces_scatter=True))


def _start_collective(cluster, held_port, options):
    from tfdist.comm.tf_collective import CollectiveCommunicator

    communicator = CollectiveCommunicator(cluster, held_port)
    _configure_collective(communicator, options)
    return communicator


def _configure_collective(communicator, options):
    """The collective engine's choice of TensorFlow implementation
    (`tf_collective.collective_placement`): process-wide, the latest strategy's stands."""
    from tfdist.comm.tf_collective import CollectiveCommunicator

    if options.get("implementation") is not None and isinstance(communicator,
                                                                 CollectiveCommunicator):
        communicator.implementation = options["implementation"]


register(Engine(
    name="collective",
    transports=(Transport(COLLECTIVE, {}, "nothing: every job runs it"),),
    runs=lambda cluster: ((COLLECTIVE,), {}),
    refusal=lambda cluster: None,
    start=_start_collective,
    options=lambda fusion_threshold_bytes, implementation: {"implementation": implementation},
    configure=_configure_collective,
    needs_worker_addresses=True,  # its gRPC server's
    point_to_point=True))
