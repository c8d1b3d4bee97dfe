"""The one line a job prints at start-up: what trains, on how many processes, moved by which engine.

Written by the chief when a strategy is created (`tfdist.chief_log`, once
per distinct line), so a job of P processes prints it once, under any
launcher:

    tfdist: RingAllReduceStrategy on 2 processes launched by tfdist-run: aggregator ring on
    horovod-gloo (backend 'auto': the fastest engine this job can run, 0.58x TensorFlow's
    ring time at 4 MiB buckets), compression none; CPU only, 1 intra-op thread per process

It gathers what the process set-up decided before the strategy existed (the
CPU threads, `process_setup.cpu_share`; the GPU, `process_setup.gpu_placement`,
whose per-rank line shows only where the machine has GPUs) and the engine the
strategy took. One process that trains alone says only that it trains as
plain Keras: there is nothing to aggregate and no engine to advertise.
"""

from tfdist import runtime
from tfdist.comm import engines
from tfdist.process_setup import cpu_share, gpu_placement


def start_up_line(strategy, engine_reason=None):
    """The job's start-up line for `strategy` (a `DataParallelStrategy` just created)."""
    cluster = strategy.cluster
    name = type(strategy).__name__
    extended = strategy.extended
    if strategy.world_size == 1 and not cluster.server_addresses:
        return (f"tfdist: {name} on 1 process: Keras trains as it does without tfdist; start "
                "the script with tfdist-run -np N (or horovodrun, mpirun, srun) to train on N "
                "processes")
    processes = f"{strategy.world_size} process{'es' if strategy.world_size != 1 else ''}"
    if cluster.server_addresses:
        processes += f" and {len(cluster.server_addresses)} parameter server(s)"
    line = (f"tfdist: {name} on {processes} launched by {cluster.launcher}: aggregator "
            f"{extended.aggregator.name} on {engine_label(extended.communicator.engine)}")
    if engine_reason:
        line += f" ({engine_reason})"
    line += f", compression {extended.compression_name}"
    line += extended.input_mode.summary()
    return line + "; " + devices()


def engine_label(engine):
    """"horovod-gloo" / "horovod-mpi" for Horovod's engine (its controller named), else `engine`:
    the transport (`tfdist.comm.engines.Transport`) this process runs it over (the simulated
    engine of the in-process tests is no registered one: its name)."""
    if engine not in engines.ENGINES:
        return engine
    return engines.ENGINES[engine].label_for(runtime.cluster())


def devices():
    """What each process computes on: "CPU only, 1 intra-op thread per process", "GPU per
    process (local rank)"."""
    placement = gpu_placement.placed()
    if placement is not None and placement.gpu is not None:
        where = "a GPU per process (see each rank's line)"
    else:
        where = "CPU only"
    threads = cpu_share.threads_set()
    if threads is not None:
        where += f", {threads} intra-op thread{'s' if threads != 1 else ''} per process"
    return where
