"""Which engine `RingAllReduceStrategy(backend="auto")` sums gradients with: the fastest the job can run.

Engines, and what a job needs to run each (`available_engines`):

* "mpi"           Open MPI's own collectives from compiled TensorFlow ops
                  (`tfdist.comm.mpi`), the processes started as one MPI job: mpirun,
                  `horovodrun --mpi`, plain tfdist-run where Open MPI is installed
                  (`tfdist.launch.mpi_job`), srun with PMIx;
* "horovod-mpi"   Horovod built with MPI, the process started by mpirun
                  (`horovodrun --mpi` runs mpirun): Open MPI's shared memory
                  between the processes of a host;
* "horovod-gloo"  Horovod, the process started by horovodrun (Gloo) or
                  tfdist-run (which starts Gloo's rendezvous when Horovod is
                  installed);
* "collective"    TensorFlow's collectives over its gRPC runtime: every job.

Among those available, `choose` takes the one with the least measured time
per all-reduce at the job's bucket size (`fusion_threshold_bytes`: the
bucket every large model's gradient fills), from `MEASURED_OVER_TF_RING`: each
engine's time over TensorFlow's ring measured in the same processes
(`tfdist-bench --only engines`, 2 processes on one host, results in
benchmarks/results/engine_curves.json; a test keeps this table equal to that
file's summary, so a re-run that changes the order changes the choice).
The MPI engine is the fastest at every size measured, then Horovod's engines, then the
gRPC ring (the curves' summary in engine_curves.json), so "auto" takes the MPI engine
in an MPI job, else Horovod whenever the launcher gave Horovod its peers; it cannot
start either for a launcher that did not (srun without PMIx, TF_CONFIG, Ray,
Kubernetes: no MPI job, no rendezvous for Gloo). The
strategy's start-up line says which engine it took and why; with
TFDIST_VERBOSE=1 also what the faster ones would need (`faster_engines`).

Cost: a table lookup at strategy construction; nothing per step.
"""

import bisect
from typing import Dict, Iterable, Tuple

COLLECTIVE = "collective"
HOROVOD_MPI = "horovod-mpi"
HOROVOD_GLOO = "horovod-gloo"
MPI = "mpi"

# All-reduce time over TensorFlow's ring's (medians over rounds; the ring's over every run),
# per payload in bytes: benchmarks/results/engine_curves.json "summary" "over_tf_ring"
# (engines "mpi_engine", "mpi" and "gloo" there).
MEASURED_OVER_TF_RING: Dict[str, Dict[int, float]] = {
    MPI: {4096: 0.336, 16384: 0.287, 65536: 0.345, 262144: 0.318, 1048576: 0.277,
          4194304: 0.209, 16777216: 0.212, 67108864: 0.285},
    HOROVOD_MPI: {4096: 0.412, 16384: 0.365, 65536: 0.413, 262144: 0.384, 1048576: 0.326,
                  4194304: 0.305, 16777216: 0.248, 67108864: 0.691},
    HOROVOD_GLOO: {4096: 0.914, 16384: 0.899, 65536: 1.23, 262144: 1.066, 1048576: 1.238,
                   4194304: 0.645, 16777216: 0.574, 67108864: 0.548},
}

# What each engine needs, for the start-up line when a faster one is not available.
NEEDS = {
    MPI: "Open MPI and a start as one MPI job: tfdist-run, mpirun or srun --mpi=pmix",
    HOROVOD_MPI: "Horovod built with MPI and a start by mpirun or horovodrun --mpi",
    HOROVOD_GLOO: "Horovod and a start by horovodrun or tfdist-run",
}


def relative_time(engine: str, nbytes: int) -> float:
    """`engine`'s measured all-reduce time over TensorFlow's ring for a bucket of `nbytes`:
    the curve's value at the largest measured size <= nbytes (the smallest below it)."""
    if engine == COLLECTIVE:
        return 1.0
    curve = MEASURED_OVER_TF_RING[engine]
    sizes = sorted(curve)
    index = max(bisect.bisect_right(sizes, nbytes) - 1, 0)
    return curve[sizes[index]]


def available_engines(launched_with_horovod: bool, horovod_controller: str,
                      mpi_job: bool = False) -> Tuple[str, ...]:
    """The engines this job can run: the collectives always; Horovod's, on the controller
    ("mpi" or "gloo") its launcher set up, when the launcher gave Horovod its peers; Open
    MPI's own (`MPI`), when the processes are one MPI job and its ops load."""
    engines = (MPI,) if mpi_job else ()
    if launched_with_horovod:
        engines += (HOROVOD_MPI if horovod_controller == "mpi" else HOROVOD_GLOO,)
    return engines + (COLLECTIVE,)


def choose(available: Iterable[str], nbytes: int) -> Tuple[str, str]:
    """(engine, why): the available engine of least measured time for a bucket of `nbytes`, and
    the reason the strategy's start-up line gives for it."""
    available = tuple(available)
    engine = min(available, key=lambda e: relative_time(e, nbytes))
    if len(available) == 1:
        return engine, "the one engine this job can run"
    return engine, (f"the fastest engine this job can run, {relative_time(engine, nbytes):.2f}x "
                    f"TensorFlow's ring time at {nbytes / 2**20:g} MiB buckets")


def faster_engines(available: Iterable[str], nbytes: int) -> str:
    """The measured engines faster than `choose`'s that this job cannot run, and what each
    needs ("" if none): said at start-up with TFDIST_VERBOSE=1, and in docs/strategies.md."""
    available = tuple(available)
    chosen = relative_time(choose(available, nbytes)[0], nbytes)
    faster = [e for e in MEASURED_OVER_TF_RING
              if e not in available and relative_time(e, nbytes) < chosen]
    return ", ".join(f"{e} ({relative_time(e, nbytes):.2f}x; needs {NEEDS[e]})" for e in faster)


def backend_of(engine: str) -> str:
    """The strategy's backend name for `engine`: "mpi", "horovod" or "collective"."""
    return engine if engine in (COLLECTIVE, MPI) else "horovod"
