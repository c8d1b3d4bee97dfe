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
HOSTS = _declare(
    "HOSTS", "host:slots,...", "this machine", YOU,
    "tfdist-run `-H`: the hosts to start the processes on (Horovod's -H). Where one is another "
    "machine, the job starts through Open MPI's `mpirun -H` (reaching hosts by ssh); an "
    "elastic job refuses other machines.", _LAUNCH)
PORT_RANGE = _declare(
    "PORT_RANGE", "FIRST-LAST", "any free port", YOU,
    "tfdist-run `--port-range`, and every process under any launcher: the ports tfdist's "
    "processes listen on are taken from this range (a firewalled cluster opens it); tfdist-run "
    "gives mpirun's out-of-band and TCP transports the same range.", _LAUNCH)
HOROVOD = _declare(
    "HOROVOD", "flag or empty", "empty: when Horovod is installed", YOU,
    "tfdist-run `--horovod` (1) / `--no-horovod` (0): make the ranks a Horovod (Gloo) job, as "
    "horovodrun would, so that RingAllReduceStrategy(backend=\"auto\") can take Horovod's "
    "engine. Unset: when Horovod is installed.", _LAUNCH)
MPI = _declare(
    "MPI", "flag or empty", "empty: when Open MPI's mpirun is installed", YOU,
    "tfdist-run `--mpi` (1) / `--no-mpi` (0): start the ranks as one MPI job through Open "
    "MPI's mpirun, so that RingAllReduceStrategy(backend=\"auto\") can take the MPI engine. "
    "Unset: when mpirun is Open MPI's, except for elastic and --keep-going jobs.", _LAUNCH)
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
MIN_NP = _declare(
    "MIN_NP", "int", "-np", YOU,
    "tfdist-run `--min-np` (Horovod's): the fewest processes an elastic job goes on with; "
    "below it the job waits for slots (`--elastic-timeout`).", _LAUNCH)
MAX_NP = _declare(
    "MAX_NP", "int", "the slots (-np without a discovery script)", YOU,
    "tfdist-run `--max-np` (Horovod's): the most processes an elastic job grows to.", _LAUNCH)
HOST_DISCOVERY_SCRIPT = _declare(
    "HOST_DISCOVERY_SCRIPT", "command", "", YOU,
    "tfdist-run `--host-discovery-script` (Horovod's): prints `host:slots` lines, run every "
    "second; a changed count resizes the job at an agreed step.", _LAUNCH)
SLOTS_PER_HOST = _declare(
    "SLOTS_PER_HOST", "int", "1", YOU,
    "tfdist-run `--slots-per-host`: the slots of a discovered host printed without `:slots`.",
    _LAUNCH)
ELASTIC_TIMEOUT = _declare(
    "ELASTIC_TIMEOUT", "float (seconds)", "600", YOU,
    "tfdist-run `--elastic-timeout`: how long an elastic job waits for `--min-np` slots, or for "
    "its ranks to take a resize request.", _LAUNCH)
RESET_LIMIT = _declare(
    "RESET_LIMIT", "int", "unbounded", YOU,
    "tfdist-run `--reset-limit` (Horovod's): the most restarts of an elastic job (resizes "
    "and failures).", _LAUNCH)
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
                         "0 on the first run, then 1, 2, ... per restart (`--max-restarts`, "
                         "an elastic resize).", _PROCESS)
ELASTIC_DIR = _declare(
    "ELASTIC_DIR", "path", "", BY_LAUNCHER,
    "An elastic tfdist-run's channel to its ranks: the resize request they take at an agreed "
    "step, the chief's last backup position (`tfdist.fault_tolerance.elastic_channel`).",
    _PROCESS)

RANK_VARIABLES = _declare(
    "RANK_VARIABLES", "comma-separated names", "", BY_LAUNCHER,
    "tfdist-run's MPI job (`tfdist.launch.mpi_job`): the variables whose value is the rank "
    "(TFDIST_RANK, Horovod's rank on Gloo, ...), set by each rank from mpirun's.", _LAUNCH)
EXIT_REPORTS_DIR = _declare(
    "EXIT_REPORTS_DIR", "path", "", BY_LAUNCHER,
    "tfdist-run's MPI job (`tfdist.launch.mpi_job`): where each rank's wrapper leaves the exit "
    "code of a rank that failed, so that tfdist-run sees the failure even while mpirun does "
    "not end (its own start-up waits can be held by a stranger's connection).", _LAUNCH)
JOINED_DIR = _declare(
    "JOINED_DIR", "path", "", BY_LAUNCHER,
    "Where each rank notes that it joined a multi-process tfdist strategy, so that tfdist-run "
    "can say at the end of a job in which none did that its processes ran independently "
    "(`tfdist.process_setup.joined_strategy`).", _PROCESS)

# ------------------------------------------------------------------- other launchers
_CLUSTER = "Where peers are found (srun, Kubernetes, any launcher)"
HOST = _declare(
    "HOST", "host name", "the host name", YOU,
    "The name peers reach this process by, where addresses are swapped (horovodrun, mpirun, "
    "srun).", _CLUSTER)
SECRET = _declare(
    "SECRET", "any string (a long random one)", "tfdist-run: a new one per job", YOU,
    "The job's secret, the same in every process: tfdist's own servers (srun's address store, "
    "the MPI engine's liveness ports, parameter servers, the chief's save service) refuse "
    "requests without it (`tfdist.process_setup.job_secret`). tfdist-run sets a new one per "
    "job, mpirun jobs agree one through MPI; under other launchers give every process the same "
    "value (`openssl rand -hex 32`), else tfdist's servers answer anyone.", _CLUSTER)
NETWORK_INTERFACE = _declare(
    "NETWORK_INTERFACE", "interface name", "the host name's address, else every interface", YOU,
    "tfdist-run `--network-interface`, and every process under any launcher: in a job across "
    "hosts, tfdist listens on this interface's address and tells its peers that address "
    "(Horovod's `--network-interface`, Open MPI's `*_if_include`). A job on one host listens "
    "on loopback.", _CLUSTER)
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
OP_CACHE = _declare(
    "OP_CACHE", "path", "~/.cache/tfdist/ops", YOU,
    "Where tfdist keeps the compiled TensorFlow ops of its MPI engine "
    "(`tfdist.comm.mpi_kernels`), one file per TensorFlow and Open MPI version; built by "
    "`make install`, or on first use.", _INSTALL)
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
EMULATED_HOST_SETUP = _declare(
    "EMULATED_HOST_SETUP", "JSON", "", "the emulated cluster (benchmarks.netns)",
    "Per emulated host's namespace, the command that gives the host its own name and disk "
    "(its ssh stand-in runs a launcher's commands through it).", _BENCH)

VARIABLES = tuple(_REGISTRY)
# What tfdist-run sets to describe a job of its own on this machine (left out where another
# launcher describes the cluster: `tfdist-run -H` across machines, through mpirun).
CLUSTER_VARIABLES = frozenset(v.name for v in (
    RANK, WORLD_SIZE, LOCAL_RANK, WORKER_ADDRESSES, SERVER_ADDRESSES, ROLE, SERVER_INDEX,
    RANK_VARIABLES, JOINED_DIR, EXIT_REPORTS_DIR))
BY_NAME = {v.name: v for v in VARIABLES}

# ------------------------------------------------------------------- other tools' variables
_FOREIGN = []


def _foreign(name, set_by, meaning, group):
    variable = Variable(name, "string", "", set_by, meaning, group)
    _FOREIGN.append(variable)
    return variable


_FROM_LAUNCHERS = "Read from the launchers (who am I, who are my peers)"
_FOR_ENGINES = "Read or set for TensorFlow and Horovod"


class Foreign:  # pylint: disable=too-few-public-methods
    """Variables of other tools that tfdist reads (or sets for the tools it starts): the
    launchers' rank and size, TensorFlow's and Horovod's settings. Read through these, as the
    `TFDIST_*` ones are (tests/test_env_vars.py fails on a name spelled elsewhere)."""

    HOROVOD_RANK = _foreign("HOROVOD_RANK", "horovodrun", "The process's rank.", _FROM_LAUNCHERS)
    HOROVOD_SIZE = _foreign("HOROVOD_SIZE", "horovodrun", "Number of processes.", _FROM_LAUNCHERS)
    HOROVOD_LOCAL_RANK = _foreign("HOROVOD_LOCAL_RANK", "horovodrun", "Rank on this host.",
                                  _FROM_LAUNCHERS)
    HOROVOD_LOCAL_SIZE = _foreign("HOROVOD_LOCAL_SIZE", "horovodrun", "Processes on this host.",
                                  _FROM_LAUNCHERS)
    HOROVOD_HOSTNAME = _foreign("HOROVOD_HOSTNAME", "horovodrun",
                                "This host's name in the job (its address for peers).",
                                _FROM_LAUNCHERS)
    HOROVOD_GLOO_RENDEZVOUS_ADDR = _foreign(
        "HOROVOD_GLOO_RENDEZVOUS_ADDR", "horovodrun (Gloo), tfdist-run",
        "Horovod's rendezvous server: a Gloo job; tfdist swaps its addresses there.",
        _FROM_LAUNCHERS)
    HOROVOD_GLOO_RENDEZVOUS_PORT = _foreign(
        "HOROVOD_GLOO_RENDEZVOUS_PORT", "horovodrun (Gloo), tfdist-run",
        "The rendezvous server's port.", _FROM_LAUNCHERS)
    HOROVOD_GLOO_IFACE = _foreign(
        "HOROVOD_GLOO_IFACE", "horovodrun (--network-interface)",
        "The interface a Horovod job across hosts uses; tfdist listens there too.",
        _FROM_LAUNCHERS)
    HOROVOD_CPU_OPERATIONS = _foreign("HOROVOD_CPU_OPERATIONS", "you, horovodrun",
                                      "`gloo`: Horovod's CPU operations run on Gloo.",
                                      _FROM_LAUNCHERS)
    PMIX_RANK = _foreign("PMIX_RANK", "srun --mpi=pmix, mpirun",
                         "The process's rank in a PMIx job: an MPI job under srun.",
                         _FROM_LAUNCHERS)
    OMPI_COMM_WORLD_RANK = _foreign("OMPI_COMM_WORLD_RANK", "mpirun (Open MPI)",
                                    "The process's rank.", _FROM_LAUNCHERS)
    OMPI_COMM_WORLD_SIZE = _foreign("OMPI_COMM_WORLD_SIZE", "mpirun (Open MPI)",
                                    "Number of processes.", _FROM_LAUNCHERS)
    OMPI_COMM_WORLD_LOCAL_RANK = _foreign("OMPI_COMM_WORLD_LOCAL_RANK", "mpirun (Open MPI)",
                                          "Rank on this host.", _FROM_LAUNCHERS)
    OMPI_COMM_WORLD_LOCAL_SIZE = _foreign("OMPI_COMM_WORLD_LOCAL_SIZE", "mpirun (Open MPI)",
                                          "Processes on this host.", _FROM_LAUNCHERS)
    PMI_RANK = _foreign("PMI_RANK", "MPICH / Intel MPI (Hydra), srun --mpi=pmi2",
                        "A rank from a PMI launcher (refused: not Open MPI; or checked "
                        "against srun's).", _FROM_LAUNCHERS)
    PMI_SIZE = _foreign("PMI_SIZE", "MPICH / Intel MPI (Hydra)",
                        "A PMI launcher's process count.", _FROM_LAUNCHERS)
    SLURM_PROCID = _foreign("SLURM_PROCID", "srun", "The task's rank.", _FROM_LAUNCHERS)
    SLURM_STEP_ID = _foreign("SLURM_STEP_ID", "srun", "The job step (with SLURM_PROCID: an "
                             "srun step, not sbatch's batch script).", _FROM_LAUNCHERS)
    SLURM_STEP_NUM_TASKS = _foreign("SLURM_STEP_NUM_TASKS", "srun", "Tasks in the step.",
                                    _FROM_LAUNCHERS)
    SLURM_LOCALID = _foreign("SLURM_LOCALID", "srun", "The task's rank on its node.",
                             _FROM_LAUNCHERS)
    SLURM_STEP_NODELIST = _foreign("SLURM_STEP_NODELIST", "srun", "The step's nodes (a Slurm "
                                   "hostlist); the first holds rank 0's store.", _FROM_LAUNCHERS)
    SLURM_STEP_TASKS_PER_NODE = _foreign("SLURM_STEP_TASKS_PER_NODE", "srun",
                                         "Tasks per node, e.g. `2(x3),1`.", _FROM_LAUNCHERS)
    SLURMD_NODENAME = _foreign("SLURMD_NODENAME", "srun", "This node's name in the hostlist.",
                               _FROM_LAUNCHERS)
    SLURM_JOB_ID = _foreign("SLURM_JOB_ID", "srun", "The job id (with the step id: the "
                            "rendezvous port).", _FROM_LAUNCHERS)
    TF_CONFIG = _foreign("TF_CONFIG", "you, Ray Train, a Kubernetes operator",
                         "TensorFlow's cluster spec: workers, chief, ps and this task.",
                         _FROM_LAUNCHERS)
    JOB_COMPLETION_INDEX = _foreign("JOB_COMPLETION_INDEX", "Kubernetes (Indexed Job)",
                                    "The pod's index: its rank.", _FROM_LAUNCHERS)
    HOSTNAME = _foreign("HOSTNAME", "Kubernetes, the shell",
                        "The pod's host name (`<job>-<index>`: the Job's name).",
                        _FROM_LAUNCHERS)
    CUDA_VISIBLE_DEVICES = _foreign("CUDA_VISIBLE_DEVICES", "you, the scheduler",
                                    "GPUs this process may use; GPU placement picks among them.",
                                    _FOR_ENGINES)
    TF_GRPC_REUSE_PORT = _foreign(
        "TF_GRPC_REUSE_PORT", "tfdist, unless you set it",
        "TensorFlow's gRPC server binds its port with SO_REUSEPORT: beside the reservation that "
        "held the port since it was chosen (`tfdist.comm.ports`).", _FOR_ENGINES)
    TF_CPP_MIN_LOG_LEVEL = _foreign("TF_CPP_MIN_LOG_LEVEL", "you; tfdist when unset",
                                    "TensorFlow's C++ log level: tfdist sets 1 (no start-up "
                                    "notices) unless you set it.", _FOR_ENGINES)
    TF_NUM_INTRAOP_THREADS = _foreign("TF_NUM_INTRAOP_THREADS", "you",
                                      "TensorFlow's intra-op threads: when set, tfdist's CPU "
                                      "share leaves them alone.", _FOR_ENGINES)
    HOROVOD_GLOO_TIMEOUT_SECONDS = _foreign("HOROVOD_GLOO_TIMEOUT_SECONDS", "tfdist (default)",
                                            "Set to the job timeout unless you set it.",
                                            _FOR_ENGINES)
    HOROVOD_STALL_SHUTDOWN_TIME_SECONDS = _foreign(
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "tfdist (default)",
        "Set to the job timeout unless you set it: a stalled rank ends the job.", _FOR_ENGINES)
    HOROVOD_STALL_CHECK_TIME_SECONDS = _foreign(
        "HOROVOD_STALL_CHECK_TIME_SECONDS", "tfdist (default)",
        "Horovod's stall check period: the job timeout when under 60 s (Horovod's default), "
        "unless you set it (Horovod ignores a shutdown time below it).", _FOR_ENGINES)
    HOROVOD_CYCLE_TIME = _foreign("HOROVOD_CYCLE_TIME", "tfdist (default)",
                                  "Horovod's cycle time, tfdist's measured default unless set.",
                                  _FOR_ENGINES)
    HOROVOD_TIMELINE = _foreign("HOROVOD_TIMELINE", "tfdist (when profiling)",
                                "`DYNAMIC`: Horovod's timeline starts with the profile.",
                                _FOR_ENGINES)
    HOROVOD_FUSION_THRESHOLD = _foreign("HOROVOD_FUSION_THRESHOLD", "tfdist (bucket_bytes)",
                                        "Horovod's fusion buffer: the strategy's bucket size.",
                                        _FOR_ENGINES)
    PMIX_MCA_PSEC = _foreign("PMIX_MCA_psec", "tfdist-run (default), you",
                             "How mpirun's PMIx server authenticates its ranks: tfdist-run "
                             "sets `native` for its one-host MPI job unless you set it (PMIx "
                             "otherwise retries munge's socket for 2.4 s where munged is "
                             "installed but not running).", _FOR_ENGINES)


FOREIGN_VARIABLES = tuple(_FOREIGN)


def process_environment_without_tfdist(environ: Optional[Mapping[str, str]] = None):
    """`environ` (default: this process's) without any `TFDIST_*` variable."""
    return {k: v for k, v in (os.environ if environ is None else environ).items()
            if not k.startswith(PREFIX)}


def markdown_table() -> str:
    """The documentation's table of every variable, grouped, in declaration order (tfdist's
    own, then the other tools' it reads or sets)."""
    lines = []
    group = None
    for variable in VARIABLES + FOREIGN_VARIABLES:
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
