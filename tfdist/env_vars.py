"""Every `TFDIST_*` environment variable: one registry the code reads through and the docs are made from.

Each `Variable` says its name, type, default, who sets it (you, `tfdist-run`
for the processes it starts, the Kubernetes manifest, `make install`) and
what it does. The library names a variable only through this module - the
module constants below (`RANK`, `TIMEOUT`, ...) and their `get` / `flag` /
`integer` readers - so a test (tests/test_env_vars.py) can fail when code
mentions a `TFDIST_*` name this registry does not declare, and the
documentation's table (`markdown_table`, rendered into the docs site's
"Environment variables" page) cannot fall behind the code.

Reading costs one dictionary lookup; nothing is cached, so a test or a
launcher that changes the environment sees its change.

Example:

```python
from tfdist import env_vars
env_vars.TIMEOUT.get()          # "120" or None
env_vars.SHARE_GPUS.flag()      # True when set to anything but "", "0"
print(env_vars.markdown_table())
```
"""

import dataclasses
import os
from typing import Mapping, Optional

PREFIX = "TFDIST_"
FALSE_WORDS = ("", "0", "false", "no", "off")

YOU = "you"
BY_LAUNCHER = "tfdist-run (for the processes it starts)"
MANIFEST = "you, in the pod template (Kubernetes)"
MAKE = "you, for `make install`"


@dataclasses.dataclass(frozen=True)
class Variable:
    """One environment variable: what the docs table shows, and how the code reads it."""

    name: str
    type: str  # as the table shows it: "int", "float", "flag", "string", ...
    default: str  # as the table shows it ("" for none)
    set_by: str
    meaning: str
    group: str

    def get(self, environ: Optional[Mapping[str, str]] = None,
            default: Optional[str] = None) -> Optional[str]:
        """The raw value in `environ` (default: this process's environment), or `default`."""
        return (os.environ if environ is None else environ).get(self.name, default)

    def is_set(self, environ: Optional[Mapping[str, str]] = None) -> bool:
        return self.name in (os.environ if environ is None else environ)

    def flag(self, environ: Optional[Mapping[str, str]] = None) -> bool:
        """False when unset or "", "0", "false", "no", "off" (any case); True otherwise."""
        return (self.get(environ) or "").strip().lower() not in FALSE_WORDS

    def integer(self, environ: Optional[Mapping[str, str]] = None,
                default: Optional[int] = None) -> Optional[int]:
        """The value as an int (`default` when unset or empty); ValueError naming the
        variable when it is not an integer."""
        raw = (self.get(environ) or "").strip()
        if not raw:
            return default
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{self.name} must be an integer. Got: {raw!r}") from None

    def __str__(self):
        return self.name


_REGISTRY = []


def _declare(name, type_, default, set_by, meaning, group):
    variable = Variable(PREFIX + name, type_, default, set_by, meaning, group)
    _REGISTRY.append(variable)
    return variable


# ------------------------------------------------------------------- tfdist-run's options
_LAUNCH = "Options of tfdist-run"
NP = _declare("NP", "int", "1", YOU, "tfdist-run `-np`: number of training processes.", _LAUNCH)
NUM_SERVERS = _declare(
    "NUM_SERVERS", "int", "0", YOU,
    "tfdist-run `--num-servers`: dedicated parameter-server processes. Refused under srun, "
    "mpirun and Kubernetes, where every process trains (servers are co-located).", _LAUNCH)
TIMEOUT = _declare(
    "TIMEOUT", "float (seconds)", "300", f"{YOU}; {BY_LAUNCHER}",
    "Longest any rank waits for a peer (start-up, a collective, a barrier) before it fails "
    "naming the peer; tfdist-run `--timeout` sets it for its processes.", _LAUNCH)
PORT_BASE = _declare(
    "PORT_BASE", "int", "free ports", YOU,
    "tfdist-run `--port-base`: first of the consecutive ports its processes listen on.", _LAUNCH)
HOROVOD = _declare(
    "HOROVOD", "flag", "0", YOU,
    "tfdist-run `--horovod`: also make the ranks a Horovod (Gloo) job, as horovodrun would.",
    _LAUNCH)
VERBOSE = _declare(
    "VERBOSE", "flag", "0", YOU,
    "tfdist-run `--verbose`: relay TensorFlow's start-up notices and every rank's identical "
    "lines unfolded; in a process, keep TensorFlow's own logging.", _LAUNCH)
KEEP_GOING = _declare(
    "KEEP_GOING", "flag", "0", YOU,
    "tfdist-run `--keep-going`: let the other processes finish after one fails (not a "
    "server); the job still exits with the failure's code.", _LAUNCH)
MAX_RESTARTS = _declare(
    "MAX_RESTARTS", "int", "0", YOU,
    "tfdist-run `--max-restarts`: restart the whole group up to N times after a failure or a "
    "preemption; the ranks resume from their BackupAndRestore backup.", _LAUNCH)
PROFILE_DIR = _declare(
    "PROFILE_DIR", "path", "", f"{YOU}; {BY_LAUNCHER}",
    "tfdist-run `--profile DIR`: every rank profiles into DIR/rank_<r>, merged afterwards.",
    _LAUNCH)
PROFILE_STEPS = _declare(
    "PROFILE_STEPS", "A:B (batches)", "10:12", f"{YOU}; {BY_LAUNCHER}",
    "tfdist-run `--profile-steps`: the training batches profiled (1-based, inclusive).",
    _LAUNCH)

# ------------------------------------------------------------------- set by tfdist-run
_PROCESS = "Set by tfdist-run for each process"
RANK = _declare("RANK", "int", "", BY_LAUNCHER, "This training process's rank.", _PROCESS)
WORLD_SIZE = _declare("WORLD_SIZE", "int", "", BY_LAUNCHER,
                      "Number of training processes.", _PROCESS)
LOCAL_RANK = _declare("LOCAL_RANK", "int", "the rank", BY_LAUNCHER,
                      "Rank among the training processes of this host (GPU placement).",
                      _PROCESS)
WORKER_ADDRESSES = _declare("WORKER_ADDRESSES", "host:port,...", "", BY_LAUNCHER,
                            "Every training process's address, in rank order.", _PROCESS)
SERVER_ADDRESSES = _declare("SERVER_ADDRESSES", "host:port,...", "", BY_LAUNCHER,
                            "Every dedicated parameter server's address.", _PROCESS)
ROLE = _declare("ROLE", "worker | server", "worker", BY_LAUNCHER,
                "Whether this process trains or serves parameters.", _PROCESS)
SERVER_INDEX = _declare("SERVER_INDEX", "int", "", BY_LAUNCHER,
                        "A dedicated server's index among the servers.", _PROCESS)
RESTART_COUNT = _declare("RESTART_COUNT", "int", "0", BY_LAUNCHER,
                         "0 on the first run, then 1, 2, ... per restart (`--max-restarts`).",
                         _PROCESS)

# ------------------------------------------------------------------- other launchers
_CLUSTER = "Where peers are found (srun, Kubernetes, any launcher)"
HOST = _declare(
    "HOST", "host name", "the host name", YOU,
    "The name peers reach this process by, where addresses are swapped (horovodrun, mpirun, "
    "srun).", _CLUSTER)
RENDEZVOUS_HOST = _declare(
    "RENDEZVOUS_HOST", "host name", "the step's first host", YOU,
    "srun: the host of rank 0's address store, when rank 0 is not on the step's first node.",
    _CLUSTER)
RENDEZVOUS_PORT = _declare(
    "RENDEZVOUS_PORT", "int", "from the job and step ids", YOU,
    "srun: the port of rank 0's address store (the same for every task).", _CLUSTER)
SERVICE = _declare(
    "SERVICE", "string", "", MANIFEST,
    "Kubernetes Indexed Job: the headless Service naming the pods (with NUM_PROCESSES).",
    _CLUSTER)
NUM_PROCESSES = _declare(
    "NUM_PROCESSES", "int", "", MANIFEST,
    "Kubernetes Indexed Job: the Job's completions, i.e. the number of processes.", _CLUSTER)
PORT = _declare("PORT", "int", "2222", MANIFEST,
                "Kubernetes Indexed Job: every pod's TensorFlow port.", _CLUSTER)
JOB_NAME = _declare("JOB_NAME", "string", "from HOSTNAME", MANIFEST,
                    "Kubernetes Indexed Job: the Job's name, when the pod's host name does "
                    "not end in -<index>.", _CLUSTER)

# ------------------------------------------------------------------- process behaviour
_BEHAVIOUR = "Behaviour of every process"
INTRA_OP_THREADS = _declare(
    "INTRA_OP_THREADS", "int >= 0", "CPUs // processes on the host", YOU,
    "TensorFlow intra-op threads per process; 0 keeps TensorFlow's default (all CPUs).",
    _BEHAVIOUR)
SHARE_GPUS = _declare(
    "SHARE_GPUS", "flag", "0", YOU,
    "Allow more training processes on a host than GPUs (GPU local_rank % GPUs).", _BEHAVIOUR)
GPU_PLACEMENT = _declare(
    "GPU_PLACEMENT", "off", "on", YOU,
    "`off` leaves GPU visibility to the script (no placement by local rank).", _BEHAVIOUR)
PREEMPTION_SIGNAL = _declare(
    "PREEMPTION_SIGNAL", "signal name | none", "SIGTERM", YOU,
    "The signal that gives a preemption notice (backup at an agreed step, exit 42); `none` "
    "turns the notice off.", _BEHAVIOUR)
ALLOW_UNTESTED_VERSIONS = _declare(
    "ALLOW_UNTESTED_VERSIONS", "flag", "0", YOU,
    "Warn instead of refusing a Keras or TensorFlow outside the supported range "
    "(`tfdist.versions`); results are then not verified.", _BEHAVIOUR)

# ------------------------------------------------------------------- installation
_INSTALL = "Installation (make install)"
WITHOUT_MPI = _declare(
    "WITHOUT_MPI", "flag", "0", MAKE,
    "No Open MPI and no mpi4py; Horovod built on Gloo only (mpirun jobs unavailable).", _INSTALL)
WHEEL_CACHE = _declare(
    "WHEEL_CACHE", "path", "~/.cache/tfdist/wheels", MAKE,
    "Where scripts/install_horovod.sh keeps the Horovod wheel it built.", _INSTALL)
HOROVOD_XLA_OPS = _declare(
    "HOROVOD_XLA_OPS", "C preprocessor macro", "undefined", "nobody (a build guard)",
    "Not an environment variable: the macro scripts/install_horovod.sh guards Horovod's XLA "
    "file with, so that file compiles to nothing.", _INSTALL)

# ------------------------------------------------------------------- the test suite
_TESTS = "The test suite (read by tests/, not by the library)"
REQUIRE_BROWSER = _declare(
    "REQUIRE_BROWSER", "flag", "0", "you; .ci/run sets it",
    "Fail, instead of skipping, the browser tests (TensorBoard, the docs site) when Chromium or "
    "ChromeDriver is missing.", _TESTS)
REQUIRE_SLURM = _declare(
    "REQUIRE_SLURM", "flag", "0", "you; .ci/run sets it (as root)",
    "Fail, instead of skipping, the srun tests when no Slurm is running.", _TESTS)
SCREENSHOT_TO = _declare(
    "SCREENSHOT_TO", "path", "", YOU,
    "Keep the TensorBoard browser test's screenshot at this path.", _TESTS)

# ------------------------------------------------------------------- the benchmarks
_BENCH = "The benchmarks (read by benchmarks/, not by the library)"
BENCH_LOCK = _declare(
    "BENCH_LOCK", "path", "", YOU,
    "The compression experiment holds an exclusive lock on this file while each job runs "
    "(machines shared with other heavy jobs).", _BENCH)
EMULATED_HOSTS = _declare(
    "EMULATED_HOSTS", "addr=namespace,...", "", "the emulated-cluster benchmark",
    "Which network namespace each emulated host's address lives in (its ssh stand-in).",
    _BENCH)

VARIABLES = tuple(_REGISTRY)
BY_NAME = {v.name: v for v in VARIABLES}


def process_environment_without_tfdist(environ: Optional[Mapping[str, str]] = None):
    """`environ` (default: this process's) without any `TFDIST_*` variable."""
    return {k: v for k, v in (os.environ if environ is None else environ).items()
            if not k.startswith(PREFIX)}


def markdown_table() -> str:
    """The documentation's table of every variable, grouped, in declaration order."""
    lines = []
    group = None
    for variable in VARIABLES:
        if variable.group != group:
            group = variable.group
            lines += ["", f"### {group}", "",
                      "| variable | type | default | set by | what it does |",
                      "|---|---|---|---|---|"]
        default = f"`{variable.default}`" if variable.default else "-"
        lines.append(f"| `{variable.name}` | {variable.type} | {default} | "
                     f"{variable.set_by} | {variable.meaning} |")
    return "\n".join(lines[1:]) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
