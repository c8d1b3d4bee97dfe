"""What every benchmark shares: the environment, launching jobs, timing steps, writing results.

* `environment()`: versions, CPUs, date and the git commit of the code that
  produced a result (with `-dirty` when the tree had uncommitted changes), so
  every JSON under `benchmarks/results/` says what it measured;
* `launch` / `launch_rows`: run a worker script under `tfdist-run`;
* `StepTimer`: a Keras callback timing every train step after the first epoch
  (compilation and warm-up excluded);
* `write_result`: write `benchmarks/results/<name>` with the environment.

Results are ratios within one run: these machines are shared and noisy.
"""

import datetime
import functools
import json
import os
import platform
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")


def git_commit():
    """The checked-out commit ("<sha>-dirty" with uncommitted changes), or "unknown"."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("-dirty" if dirty.strip() else "")


def environment():
    """Where and on what a result was measured (imports TensorFlow)."""
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "transport": "loopback",
    }


def launch(np_, worker, args, flags=()):
    """Run benchmarks/`worker` under tfdist-run with np_ processes; fail loudly."""
    command = [sys.executable, "-m", "tfdist.launch", "-np", str(np_), *flags, sys.executable,
               os.path.join(HERE, worker)] + [str(a) for a in args]
    env = worker_env()
    print("$", " ".join(command[2:]), flush=True)
    subprocess.run(command, env=env, check=True)


def mpirun_command(np_):
    """`mpirun` for np_ local processes (Open MPI; root allowed through its variables)."""
    return ["mpirun", "--oversubscribe", "-np", str(np_)]


def open_mpi_root_env():
    """What Open MPI's mpirun needs to start processes as root (it refuses otherwise)."""
    if os.getuid() != 0:
        return {}
    return {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def open_mpi_env():
    """`open_mpi_root_env()` and, unless set, PMIx authenticating the ranks by user id, as
    tfdist-run's mpirun does (`tfdist.launch.mpi_job.PMIX_SECURITY`: no 2.4 s per job
    retrying munge's socket where munge is installed but not running)."""
    from tfdist.launch import mpi_job  # pylint: disable=import-outside-toplevel

    env = open_mpi_root_env()
    if mpi_job.PMIX_SECURITY not in os.environ:
        env[mpi_job.PMIX_SECURITY] = mpi_job.LOCAL_SECURITY
    return env


@functools.lru_cache(maxsize=None)
def mpirun_available():
    """True when Open MPI's mpirun and a Horovod built with MPI are here (make install).

    Probed once per process (a Python start that imports Horovod: seconds)."""
    import shutil  # pylint: disable=import-outside-toplevel

    if shutil.which("mpirun") is None:
        return False
    probe = subprocess.run([sys.executable, "-c", "import horovod.tensorflow as h; "
                            "raise SystemExit(0 if h.mpi_built() else 1)"],
                           capture_output=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    return probe.returncode == 0


def worker_env():
    """A benchmark worker's environment: quiet TensorFlow, and the checkout importable (a
    worker run as a script has only benchmarks/ on its path, not the `benchmarks` package)."""
    path = [REPO] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(path))


def mpirun_env():
    return dict(worker_env(), **open_mpi_env())


def launch_mpirun(np_, worker, args):
    """Run benchmarks/`worker` under Open MPI's mpirun with np_ processes; fail loudly."""
    command = mpirun_command(np_) + [sys.executable, os.path.join(HERE, worker)] + [
        str(a) for a in args]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, env=mpirun_env(), check=True)


def fair_floor_process(index, command, env):
    """Process `index` of the fair floor: `command` started as tfdist-run starts its ranks (one
    MPI job, `--bind-to core`, TensorFlow's pool sized to the core) - pinned to its own CPU
    (`taskset -c`, index modulo the CPUs) with one intra-op thread - but alone, exchanging
    nothing. (command, env) to start it with; where `taskset` is missing, unpinned."""
    env = dict(env, TF_NUM_INTRAOP_THREADS="1")
    if shutil.which("taskset") is None:
        return list(command), env
    return ["taskset", "-c", str(index % (os.cpu_count() or 1))] + list(command), env


def launch_rows(tmp, worker, launches, args=()):
    """Run `worker` once per (processes, launcher flags); return all the rows it wrote.

    The worker's first argument is the JSON file it writes its rows to.
    """
    rows = []
    for index, (np_, flags) in enumerate(launches):
        out = os.path.join(tmp, f"{os.path.splitext(worker)[0]}{index}.json")
        launch(np_, worker, [out, *args], flags=flags)
        with open(out) as f:
            rows.extend(json.load(f))
    return rows


def per_round_ratios(runs, baselines, key):
    """`run[key] / baseline[key]` for each round's pair (same round: the same machine load).

    This machine is shared and its load moves lone times by tens of percent, so
    the benchmarks compare two configurations only through these paired ratios.
    """
    return [run[key] / baseline[key] for run, baseline in zip(runs, baselines)]


def write_result(name, result, results=RESULTS):
    """Write `result` to `results`/`name` (default: benchmarks/results/), with the environment
    if it has none."""
    result = dict(result)
    result.setdefault("environment", environment())
    os.makedirs(results, exist_ok=True)
    path = os.path.join(results, name)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}: {json.dumps(result.get('summary', {}))}", flush=True)
    return result


def _step_timer_class():
    import keras  # pylint: disable=import-outside-toplevel

    from tfdist.callbacks import agrees_across_ranks  # pylint: disable=import-outside-toplevel

    @agrees_across_ranks  # it never stops training: no stop-flag exchange per batch
    class StepTimer(keras.callbacks.Callback):
        """Seconds of every train step (`times`) after the first epoch (compilation, warm-up).

        Subclasses may extend `on_epoch_begin` / `on_epoch_end` to measure more per epoch.
        """

        def __init__(self):
            super().__init__()
            self.times, self.epoch, self.start = [], 0, None

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch > 0:
                self.times.append(time.perf_counter() - self.start)

    return StepTimer


def __getattr__(name):
    # StepTimer needs Keras (and so TensorFlow): built on first use, so that tools that only
    # launch jobs (tfdist-bench, the stress harness) start without importing TensorFlow.
    if name == "StepTimer":
        globals()[name] = _step_timer_class()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
