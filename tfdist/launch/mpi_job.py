"""`tfdist-run`'s ranks as one MPI job: started by Open MPI's mpirun, so the MPI engine runs.

Open MPI 4 cannot join processes started one by one into one MPI_COMM_WORLD (a
singleton's `MPI_Comm_connect` is refused: "runtime environment does not support
accept/connect"), so when the job wants the MPI engine (`tfdist.comm.mpi`) tfdist-run
starts its training processes through one `mpirun` on this host instead of one by one:

    mpirun --quiet --oversubscribe --bind-to core -np N python -m tfdist.launch.mpi_rank <command>

Each rank gets the environment tfdist-run gives every process, and `mpi_rank` turns
mpirun's rank into tfdist-run's (`TFDIST_RANK`) before it runs the command, so the
processes describe their cluster as under plain tfdist-run (ports, timeout, Horovod's
Gloo rendezvous, profiling) and are also one MPI job. Parameter servers are still
started one by one. `mpi_rank` tags each whole line of a rank's output with its rank;
`split_label` turns the tag back into tfdist-run's rank label, each rank's lines
filtered as before.

Across machines (`tfdist-run -H host:slots,...` naming another machine), the same mpirun
starts the ranks there too (`-H`, reaching each host as mpirun does, by ssh), with the job's
settings forwarded (`-x`): the ranks then describe their cluster as under any mpirun and
swap their addresses through MPI; Open MPI's TCP transports use `--network-interface`.

What mpirun changes: when a rank fails, mpirun ends the others and exits with that
rank's code, and tfdist-run names the rank from its exit report (`mpi_rank`), as it names
a rank it started itself; each rank is bound to a core of its own, as mpirun does by
default for small jobs (`--bind-to none` when `--mpi` asks for more ranks than CPUs), and
TensorFlow sizes its thread pools to that core (`tfdist.process_setup.cpu_share`).
Unbound, the step under tfdist-run was 0.05-0.19x of the floor slower than under plain
mpirun in one run of `tfdist-bench --only engine_step`; bound, the two were within that
benchmark's noise. Not for elastic jobs (their size changes between starts of single
processes).
"""

import json
import os
import re
import shutil
import subprocess
import sys
from functools import lru_cache
from typing import List, NamedTuple, Optional, Tuple

from tfdist import env_vars

LABEL = "mpirun"
# How mpirun's PMIx server and its ranks authenticate each other. On a host with munge
# installed (any Slurm node) PMIx picks its munge plugin first; where munged is not
# running, every mpirun and every MPI_Init then retries munge's socket for 2.4 s before
# it falls back (measured: `mpirun -np 2 true` 2.5 s against 0.06 s). tfdist-run's mpirun
# serves only ranks on its own host, which `native` (the socket's user id) authenticates.
# A value the user set is kept.
PMIX_SECURITY = env_vars.Foreign.PMIX_MCA_PSEC.name
LOCAL_SECURITY = "native"
# Open MPI's transports for a job on one host: shared memory between the ranks (vader) and
# to itself (self) - no TCP transport, which would listen on every interface. Open MPI 4's
# mpirun still listens for its daemons on every interface (its out-of-band channel binds
# INADDR_ANY and [::] whatever `oob_tcp_if_include` says, which only chooses the addresses
# it advertises); its PMIx server listens on loopback. The docs' Security page lists them.
ONE_HOST_SETTINGS = {"OMPI_MCA_btl": "self,vader"}
_TAG = re.compile(r"^\[tfdist-rank (\d+)\] ")  # `tfdist.launch.mpi_rank.TAG`
_EXIT = re.compile(r"^\[tfdist-rank (\d+) exited (\d+)\]\s*$")  # `mpi_rank.EXIT`


@lru_cache(maxsize=None)
def unavailable_reason() -> Optional[str]:
    """None when Open MPI's mpirun is on PATH, else why tfdist-run cannot start an MPI job."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return "no `mpirun` on PATH (Open MPI)"
    try:
        version = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                                 timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError) as error:
        return f"`mpirun --version` failed: {error}"
    if "Open MPI" not in version and "OpenRTE" not in version:
        return f"`mpirun` is not Open MPI's ({version.strip().splitlines()[:1]})"
    return None


def fits_the_cpus(num_proc: int) -> bool:
    """True when this host has a CPU for every rank (`os.sched_getaffinity`).

    Open MPI waits for a message by polling (its shared-memory transport has no blocking
    wait), so a rank waiting for a slower peer keeps its CPU busy. With more ranks than
    CPUs the waiting ranks take CPU time from the computing ones: the process-test tier,
    3- and 4-rank jobs on 2 CPUs, took 2x as long on the MPI engine as one by one on
    TensorFlow's collectives, whose waits sleep. So tfdist-run starts an oversubscribed
    job one by one unless `--mpi` asks for mpirun.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return num_proc <= cpus


def command(num_proc: int, user_command: List[str], hosts: Optional[str] = None,
            forward: Tuple[str, ...] = ()) -> List[str]:
    """The mpirun command line starting `num_proc` ranks of `user_command` on this host, or on
    `hosts` ("host:slots,...", mpirun's -H: other machines reached as mpirun reaches them,
    by ssh) with the variables named in `forward` given to every rank there (-x)."""
    root = ["--allow-run-as-root"] if os.getuid() == 0 else []
    if hosts:
        placement = ["-H", hosts] + [part for name in forward for part in ("-x", name)]
    else:
        placement = ["--oversubscribe", "--bind-to",
                     "core" if fits_the_cpus(num_proc) else "none"]
    return ["mpirun", *root, "--quiet", *placement, "-np", str(num_proc),
            sys.executable, "-m", "tfdist.launch.mpi_rank", *user_command]


def across_hosts_environment(base_env: dict, settings: dict,
                             network_interface: Optional[str]) -> dict:
    """The environment of an mpirun job across machines (`command` with `hosts`): the ranks
    find each other as under any mpirun (`tfdist.process_setup.cluster`, launcher
    "mpirun"), so none of tfdist-run's own cluster variables; `settings` (timeout, secret,
    port range, ...) on top, and Open MPI's transports on `network_interface` when named."""
    env = {name: value for name, value in base_env.items()
           if name not in env_vars.CLUSTER_VARIABLES}
    env.update(settings)
    env.setdefault(PMIX_SECURITY, LOCAL_SECURITY)
    if network_interface:
        env.setdefault("OMPI_MCA_btl_tcp_if_include", network_interface)
        env.setdefault("OMPI_MCA_oob_tcp_if_include", network_interface)
    for name, value in port_range_settings(env.get(env_vars.PORT_RANGE.name)).items():
        env.setdefault(name, value)
    return env


def environment(rank_envs: List[dict], port_range: Optional[str] = None) -> dict:
    """The environment mpirun starts every rank with, from each rank's (`rank_envs`, rank
    order): what they share, and in `env_vars.RANK_VARIABLES` the names of those whose value
    is the rank (tfdist-run's, Horovod's on Gloo), which `mpi_rank` sets from mpirun's rank.
    A variable that differs across ranks in any other way cannot be given by one mpirun: a
    ValueError names it. PMIx authenticates the ranks by user id (`PMIX_SECURITY`) unless
    the ranks' environment says otherwise; Open MPI's settings for a job on one host
    (`ONE_HOST_SETTINGS`) and for `port_range` ("FIRST-LAST") are added where the ranks'
    environment sets none of its own."""
    common = dict(rank_envs[0])
    per_rank = []
    for name in sorted(set().union(*rank_envs)):
        values = [env.get(name) for env in rank_envs]
        if all(value == values[0] for value in values):
            continue
        if values != [str(rank) for rank in range(len(rank_envs))]:
            raise ValueError(f"tfdist-run: {name} differs across the ranks ({values}) and is "
                             "not the rank: the ranks cannot be one mpirun job")
        per_rank.append(name)
        common.pop(name, None)
    common[env_vars.RANK_VARIABLES.name] = ",".join(per_rank)
    common.setdefault(PMIX_SECURITY, LOCAL_SECURITY)
    for name, value in {**ONE_HOST_SETTINGS, **port_range_settings(port_range)}.items():
        common.setdefault(name, value)
    return common


def port_range_settings(port_range: Optional[str]) -> dict:
    """Open MPI's settings that keep its listening ports in `port_range` ("FIRST-LAST"): its
    out-of-band channel's (mpirun's daemons) and its TCP transport's."""
    if not port_range:
        return {}
    first, last = (int(part) for part in port_range.split("-", 1))
    if last - first < 2:
        return {}  # too narrow to share: Open MPI keeps its own ports
    # The out-of-band channel: one fixed port per daemon, the range's first (its "dynamic"
    # ports would be listened on all at once); the TCP transport: one port per rank above.
    return {"OMPI_MCA_oob_tcp_static_ipv4_ports": str(first),
            "OMPI_MCA_btl_tcp_port_min_v4": str(first + 1),
            "OMPI_MCA_btl_tcp_port_range_v4": str(last - first)}


class RankFailure(NamedTuple):
    """A rank's exit report (`mpi_rank.report_exit`)."""

    label: str
    code: int
    last_lines: Tuple[str, ...]


def rank_failures(directory: str) -> List[RankFailure]:
    """The ranks whose wrapper reported a failure in `directory` (`mpi_rank.report_exit`), in
    rank order: tfdist-run stops the job on the first even while mpirun has not ended, and
    prints the rank's last lines where mpirun did not relay them."""
    failures = []
    try:
        names = [name for name in os.listdir(directory) if name.isdigit()]
    except OSError:
        return []
    for name in sorted(names, key=int):
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                report = json.load(f)
            failures.append(RankFailure(name, int(report["code"]),
                                        tuple(str(line) for line in report["last_lines"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return failures


def split_label(line: str) -> Tuple[Optional[str], Optional[str]]:
    """(rank label, text) of one line a rank's `mpi_rank` tagged; (None, line) for mpirun's own;
    (label, None) for a failed rank's exit report (`mpi_rank.EXIT`), which is not printed."""
    exited = _EXIT.match(line)
    if exited:
        return exited.group(1), None
    match = _TAG.match(line)
    if match is None:
        return None, line
    return match.group(1), line[match.end():]
