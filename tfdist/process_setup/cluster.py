"""Who am I, who are my peers: cluster discovery for every launcher tfdist supports.

Sources are tried in this order, and the first one present wins:

1. the `tfdist-run` environment (`TFDIST_RANK`, `TFDIST_WORLD_SIZE`, ...);
2. the `horovodrun` environment (`HOROVOD_RANK`, `HOROVOD_SIZE`, ...); peer
   addresses for tfdist's own transports are exchanged later through Horovod;
3. `TF_CONFIG` (Kubeflow TFJob / tf.distribute convention, jobs `chief`,
   `worker` and `ps`; Ray Train's `TensorflowTrainer` sets it too); training
   processes are the chief (rank 0, if present) followed by the workers in
   index order; `ps` tasks are parameter servers;
4. Open MPI's `mpirun` (`OMPI_COMM_WORLD_RANK`, `..._SIZE`, `..._LOCAL_RANK`):
   the workers' addresses are swapped through MPI (mpi4py) when the
   TensorFlow transport starts;
5. a Slurm job step started by `srun` (`SLURM_STEP_ID` marks a step: a batch
   script's own shell is one process; `SLURM_PROCID`, `SLURM_STEP_NUM_TASKS`,
   `SLURM_LOCALID`, `SLURM_STEP_NODELIST`): the addresses are swapped through
   a key-value store (Horovod's rendezvous store) that rank 0 serves on the
   first host of the step's node list (or `TFDIST_RENDEZVOUS_HOST`), at
   `TFDIST_RENDEZVOUS_PORT` or a port derived from the job and step ids;
   MPICH's or Intel MPI's mpiexec (`PMI_SIZE` without Open MPI's variables)
   is refused with a message;
6. a Kubernetes Indexed Job (`JOB_COMPLETION_INDEX`) whose pods set
   `TFDIST_SERVICE` (the headless Service that names them) and
   `TFDIST_NUM_PROCESSES` (one without the other is an error): rank i is the pod `<job>-<i>.<service>`, at
   `TFDIST_PORT` (default 2222); nothing to swap;
7. otherwise a single process.

`TFDIST_HOST` names the host peers reach a process by, where addresses are
swapped (horovodrun, mpirun, srun). Under mpirun, srun and Kubernetes every
process is a training process
(parameter-server shards are co-located with the workers); dedicated servers
need tfdist-run --num-servers or TF_CONFIG `ps` tasks.

Example:

```python
cluster = tfdist.process_setup.cluster.discover()
print(cluster.rank, cluster.world_size, cluster.is_chief)
```
"""

import dataclasses
import json
import os
import re
import typing

from tfdist.env_vars import Foreign
from tfdist import env_vars
from tfdist.process_setup.slurm_hostlist import expand_hostlist, first_host

DEFAULT_TIMEOUT_SECONDS = 300.0

# Environment variables (tfdist.env_vars declares them all) set by `tfdist-run` for each process.
ENV_RANK = env_vars.RANK.name
ENV_WORLD_SIZE = env_vars.WORLD_SIZE.name
ENV_LOCAL_RANK = env_vars.LOCAL_RANK.name
ENV_WORKER_ADDRESSES = env_vars.WORKER_ADDRESSES.name
ENV_SERVER_ADDRESSES = env_vars.SERVER_ADDRESSES.name
ENV_ROLE = env_vars.ROLE.name
ENV_SERVER_INDEX = env_vars.SERVER_INDEX.name
ENV_TIMEOUT = env_vars.TIMEOUT.name
# Set by the user (or a job manifest) under the cluster engines' launchers.
ENV_HOST = env_vars.HOST.name  # the name peers reach this process by (default: host name)
ENV_RENDEZVOUS_PORT = env_vars.RENDEZVOUS_PORT.name  # srun: port of rank 0's store
ENV_RENDEZVOUS_HOST = env_vars.RENDEZVOUS_HOST.name  # srun: rank 0's host, if not the step's first
ENV_NUM_SERVERS = env_vars.NUM_SERVERS.name  # refused under srun / mpirun (see module doc)
ENV_SERVICE = env_vars.SERVICE.name  # Kubernetes: the headless Service's name
ENV_NUM_PROCESSES = env_vars.NUM_PROCESSES.name  # Kubernetes: the Indexed Job's completions
ENV_PORT = env_vars.PORT.name  # Kubernetes: every pod's TensorFlow port
ENV_JOB_NAME = env_vars.JOB_NAME.name  # Kubernetes: the Job's name (default: from HOSTNAME)
DEFAULT_KUBERNETES_PORT = 2222
# srun without TFDIST_RENDEZVOUS_PORT: a port in [base, base + span) from the job and step ids,
# below Linux's ephemeral range (32768-60999) so that no outgoing connection holds it.
RENDEZVOUS_PORT_BASE = 20000
RENDEZVOUS_PORT_SPAN = 10000

ROLE_WORKER = "worker"
ROLE_SERVER = "server"


class Rendezvous(typing.NamedTuple):
    """Where the ranks of an srun step swap their addresses: rank 0's store, and its scope."""

    host: str
    port: int
    scope: str


@dataclasses.dataclass(frozen=True)
class Cluster:
    """This process's place in the job.

    Attributes:
        rank: index of this training process, 0 .. world_size - 1 (servers: 0).
        world_size: number of training processes (servers not counted).
        worker_addresses: "host:port" of every training process, in rank
            order, for tfdist's TensorFlow transports. Empty for a single
            process, and under horovodrun until exchanged through Horovod.
        server_addresses: "host:port" of every dedicated parameter server.
        role: "worker" for a training process, "server" for a parameter server.
        server_index: index of this server among the servers (servers only).
        launcher: where the description came from: "tfdist-run",
            "horovodrun", "TF_CONFIG", "mpirun", "srun", "kubernetes" or
            "single".
        timeout: seconds any blocking wait for a peer may last.
        local_rank: index of this process among those on its host.
        local_size: number of tfdist processes on this host, this one included
            (parameter servers too), where the launcher says it; else 1.
        host: the name the peers reach this process by, where the launcher
            leaves the addresses to be swapped (horovodrun, mpirun, srun).
        rendezvous: the `Rendezvous` (host, port, scope) of the store the
            addresses are swapped through under srun (rank 0 serves it).
    """

    rank: int = 0
    world_size: int = 1
    worker_addresses: tuple = ()
    server_addresses: tuple = ()
    role: str = ROLE_WORKER
    server_index: int = None
    launcher: str = "single"
    timeout: float = DEFAULT_TIMEOUT_SECONDS
    local_rank: int = 0
    host: str = None
    rendezvous: Rendezvous = None
    local_size: int = 1

    @property
    def is_chief(self):
        """True for the training process that logs and writes checkpoints."""
        return self.role == ROLE_WORKER and self.rank == 0

    @property
    def is_server(self):
        return self.role == ROLE_SERVER

    @property
    def on_one_host(self):
        """Every process of the job (servers too) runs on this machine, as the launcher says:
        such a job listens on loopback only (`tfdist.comm.ports.listen_address`)."""
        return self.local_size >= self.world_size + len(self.server_addresses)


def discover(environ=None):
    """Describe this process's cluster from the environment (see module doc)."""
    environ = os.environ if environ is None else environ
    timeout = _parse_timeout(environ)
    if env_vars.RANK.is_set(environ) or env_vars.ROLE.is_set(environ):
        found = _from_tfdist_run(environ, timeout)  # every process on this host
        return dataclasses.replace(
            found, local_size=found.world_size + len(found.server_addresses))
    if Foreign.HOROVOD_RANK.is_set(environ):
        return dataclasses.replace(_from_horovodrun(environ, timeout),
                                   local_size=_int_env(environ, Foreign.HOROVOD_LOCAL_SIZE.name,
                                                      default=1))
    if Foreign.TF_CONFIG.get(environ, "").strip():
        found = parse_tf_config(Foreign.TF_CONFIG.get(environ), timeout=timeout)
        beside = _tasks_beside(found)
        return dataclasses.replace(found, local_rank=beside.index(_my_address(found)),
                                   local_size=len(beside))
    if Foreign.OMPI_COMM_WORLD_RANK.is_set(environ):
        return dataclasses.replace(
            _from_open_mpi(environ, timeout),
            local_size=_int_env(environ, Foreign.OMPI_COMM_WORLD_LOCAL_SIZE.name, default=1))
    if Foreign.SLURM_PROCID.is_set(environ) and Foreign.SLURM_STEP_ID.is_set(environ):
        return dataclasses.replace(_from_srun(environ, timeout),
                                   local_size=_srun_tasks_on_this_node(environ))
    _refuse_other_mpis(environ)
    if Foreign.JOB_COMPLETION_INDEX.is_set(environ) and (env_vars.SERVICE.is_set(environ)
                                              or env_vars.NUM_PROCESSES.is_set(environ)):
        return _from_kubernetes(environ, timeout)
    return Cluster(timeout=timeout)


def _my_address(found):
    return (found.server_addresses[found.server_index] if found.is_server
            else found.worker_addresses[found.rank])


def _host(address):
    return address.rsplit(":", 1)[0]


def _tasks_beside(found):
    """TF_CONFIG: the addresses of the cluster's tasks on this task's host, workers in rank
    order, then servers: a worker's index among them is its local rank. Hosts are compared
    by the address they resolve to ("node0" and 10.88.0.1 are one host when node0 resolves
    to it), by name where a name does not resolve."""
    resolved = {}

    def machine(address):
        host = _host(address)
        if host not in resolved:
            resolved[host] = _resolved_host(host)
        return resolved[host]

    mine = machine(_my_address(found))
    return [address for address in found.worker_addresses + found.server_addresses
            if machine(address) == mine]


def _resolved_host(host):
    """`host`'s IPv4 address (any loopback address as one: 127.0.0.1), or `host` itself when it
    does not resolve."""
    import socket  # pylint: disable=import-outside-toplevel

    try:
        ip = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (OSError, IndexError, UnicodeError):
        return host
    return "127.0.0.1" if ip.startswith("127.") else ip


def workers_on_this_host(found):
    """How many training processes share this worker's host (compared by resolved address,
    as `_tasks_beside`), where the addresses are known at discovery (tfdist-run, TF_CONFIG,
    Kubernetes); None where they are not."""
    if not found.worker_addresses or found.is_server:
        return None
    hosts = {host: _resolved_host(host) for host in {_host(a) for a in found.worker_addresses}}
    mine = hosts[_host(found.worker_addresses[found.rank])]
    return sum(hosts[_host(address)] == mine for address in found.worker_addresses)


def _srun_tasks_on_this_node(environ):
    """srun: this node's entry of SLURM_STEP_TASKS_PER_NODE ("2(x3),1": 2, 2, 2, 1); 1 if unknown."""
    counts = []
    for part in Foreign.SLURM_STEP_TASKS_PER_NODE.get(environ, "").split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            return 1
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    if len(set(counts)) == 1:
        return counts[0]
    try:
        nodes = expand_hostlist(Foreign.SLURM_STEP_NODELIST.get(environ, ""))
        return counts[nodes.index(Foreign.SLURMD_NODENAME.get(environ))]
    except (ValueError, IndexError):
        return 1


def _parse_timeout(environ):
    raw = env_vars.TIMEOUT.get(environ)
    if raw is None:
        return DEFAULT_TIMEOUT_SECONDS
    try:
        timeout = float(raw)
    except ValueError:
        raise ValueError(f"{ENV_TIMEOUT} must be a number of seconds. Got: {raw!r}") from None
    if timeout <= 0:
        raise ValueError(f"{ENV_TIMEOUT} must be positive. Got: {raw!r}")
    return timeout


def _int_env(environ, name, default=None):
    raw = environ.get(name)
    if raw is None:
        if default is None:
            raise ValueError(f"{name} is not set.")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer. Got: {raw!r}") from None


def _address_list(raw, field):
    addresses = tuple(a.strip() for a in raw.split(",") if a.strip()) if raw else ()
    for address in addresses:
        validate_address(address, field)
    return addresses


def _from_tfdist_run(environ, timeout):
    role = env_vars.ROLE.get(environ, ROLE_WORKER)
    if role not in (ROLE_WORKER, ROLE_SERVER):
        raise ValueError(f"{ENV_ROLE} must be 'worker' or 'server'. Got: {role!r}")
    world_size = _int_env(environ, ENV_WORLD_SIZE)
    workers = _address_list(env_vars.WORKER_ADDRESSES.get(environ, ""), ENV_WORKER_ADDRESSES)
    servers = _address_list(env_vars.SERVER_ADDRESSES.get(environ, ""), ENV_SERVER_ADDRESSES)
    if world_size < 1:
        raise ValueError(f"{ENV_WORLD_SIZE} must be >= 1. Got: {world_size}")
    if world_size > 1 and len(workers) != world_size:
        raise ValueError(
            f"{ENV_WORKER_ADDRESSES} lists {len(workers)} addresses but "
            f"{ENV_WORLD_SIZE} is {world_size}."
        )
    if role == ROLE_SERVER:
        index = _int_env(environ, ENV_SERVER_INDEX)
        if not 0 <= index < len(servers):
            raise ValueError(
                f"{ENV_SERVER_INDEX}={index} is out of range for {len(servers)} servers."
            )
        return Cluster(0, world_size, workers, servers, ROLE_SERVER, index, "tfdist-run", timeout)
    rank = _int_env(environ, ENV_RANK)
    if not 0 <= rank < world_size:
        raise ValueError(f"{ENV_RANK}={rank} is out of range for {ENV_WORLD_SIZE}={world_size}.")
    local_rank = _int_env(environ, ENV_LOCAL_RANK, default=rank)
    return Cluster(
        rank, world_size, workers, servers, ROLE_WORKER, None, "tfdist-run", timeout, local_rank
    )


def _from_horovodrun(environ, timeout):
    rank = _int_env(environ, Foreign.HOROVOD_RANK.name)
    size = _int_env(environ, Foreign.HOROVOD_SIZE.name)
    local_rank = _int_env(environ, Foreign.HOROVOD_LOCAL_RANK.name, default=0)
    if not 0 <= rank < size:
        raise ValueError(f"HOROVOD_RANK={rank} is out of range for HOROVOD_SIZE={size}.")
    return Cluster(rank, size, (), (), ROLE_WORKER, None, "horovodrun", timeout, local_rank,
                   host=env_vars.HOST.get(environ) or None)


def _rank_and_size(environ, rank_name, size_name, local_name):
    size = _int_env(environ, size_name)
    rank = _int_env(environ, rank_name)
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"{rank_name}={rank} is out of range for {size_name}={size}.")
    return rank, size, _int_env(environ, local_name, default=0)


def _refuse_other_mpis(environ):
    """MPICH's or Intel MPI's mpiexec (PMI_RANK / PMI_SIZE, no Open MPI variables): refused."""
    if Foreign.PMI_SIZE.get(environ, "1").strip() not in ("", "0", "1"):
        raise ValueError(
            f"PMI_SIZE={Foreign.PMI_SIZE.get(environ)} but no Open MPI variables: this process was "
            "started by an MPI launcher tfdist does not read (MPICH's or Intel MPI's mpiexec). "
            "Use Open MPI's mpirun, srun, tfdist-run, or give every process TF_CONFIG."
        )


def _refuse_dedicated_servers(environ, launcher):
    if env_vars.NUM_SERVERS.get(environ, "0").strip() not in ("", "0"):
        raise ValueError(
            f"{ENV_NUM_SERVERS} is set, but under {launcher} every process trains: tfdist "
            "cannot tell the servers their peers' addresses before training starts. "
            "ParameterServerStrategy co-locates its shards with the workers there; for "
            "dedicated servers launch with `tfdist-run --num-servers K` or TF_CONFIG 'ps' tasks."
        )


def _this_host(environ, default=None):
    import socket  # pylint: disable=import-outside-toplevel

    return env_vars.HOST.get(environ) or default or socket.gethostname()


def _from_open_mpi(environ, timeout):
    _refuse_dedicated_servers(environ, "mpirun")
    rank, size, local_rank = _rank_and_size(
        environ, Foreign.OMPI_COMM_WORLD_RANK.name, Foreign.OMPI_COMM_WORLD_SIZE.name,
        Foreign.OMPI_COMM_WORLD_LOCAL_RANK.name)
    return Cluster(rank, size, (), (), ROLE_WORKER, None, "mpirun", timeout, local_rank,
                   host=_this_host(environ))


def _from_srun(environ, timeout):
    _refuse_dedicated_servers(environ, "srun")
    rank, size, local_rank = _rank_and_size(environ, Foreign.SLURM_PROCID.name,
                                            Foreign.SLURM_STEP_NUM_TASKS.name,
                                            Foreign.SLURM_LOCALID.name)
    if (Foreign.PMI_RANK.is_set(environ)
            and Foreign.PMI_RANK.get(environ) != Foreign.SLURM_PROCID.get(environ)):
        raise ValueError(
            f"srun task {rank} has PMI_RANK={Foreign.PMI_RANK.get(environ)}: an MPI launcher (MPICH's "
            "mpiexec?) runs inside this job step; tfdist reads srun's own tasks, or Open MPI's "
            "mpirun."
        )
    if not Foreign.SLURM_STEP_NODELIST.is_set(environ):
        raise ValueError("srun: SLURM_STEP_NODELIST is not set; cannot find the first host.")
    job_id = _int_env(environ, Foreign.SLURM_JOB_ID.name)
    step_id = _int_env(environ, Foreign.SLURM_STEP_ID.name)
    node = Foreign.SLURMD_NODENAME.get(environ)
    host = (env_vars.RENDEZVOUS_HOST.get(environ)
            or first_host(Foreign.SLURM_STEP_NODELIST.get(environ)))
    if rank == 0 and node and node != host:
        raise ValueError(
            f"srun task 0 runs on {node}, not on {host}, the first host of the step (an "
            f"arbitrary task distribution?): set {ENV_RENDEZVOUS_HOST}={node} for every task."
        )
    if env_vars.RENDEZVOUS_PORT.is_set(environ):
        port = _int_env(environ, ENV_RENDEZVOUS_PORT)
        if not 0 < port < 65536:
            raise ValueError(f"{ENV_RENDEZVOUS_PORT} must be a port number. Got: {port}")
    else:
        port = rendezvous_port(job_id, step_id)
    return Cluster(rank, size, (), (), ROLE_WORKER, None, "srun", timeout, local_rank,
                   host=_this_host(environ, node),
                   rendezvous=Rendezvous(host, port, f"tfdist-{job_id}.{step_id}"))


def rendezvous_port(job_id, step_id):
    """The port rank 0 of a Slurm job step serves its address store on (same on every task).

    Two steps collide only if their (job * 31 + step) agree modulo the span
    and both exchanges run at once on the same first host; rank 0's bind then
    fails with a message naming TFDIST_RENDEZVOUS_PORT.
    """
    return RENDEZVOUS_PORT_BASE + (job_id * 31 + step_id) % RENDEZVOUS_PORT_SPAN


def _from_kubernetes(environ, timeout):
    _refuse_dedicated_servers(environ, "a Kubernetes Indexed Job")
    index = _int_env(environ, Foreign.JOB_COMPLETION_INDEX.name)
    for name, other in ((ENV_SERVICE, ENV_NUM_PROCESSES), (ENV_NUM_PROCESSES, ENV_SERVICE)):
        if name in environ and other not in environ:
            raise ValueError(
                f"Kubernetes Indexed Job: {name} is set but {other} is not; set "
                f"{ENV_NUM_PROCESSES} to the Job's completions and {ENV_SERVICE} to the "
                "headless Service's name (see examples/kubernetes/)."
            )
    size = _int_env(environ, ENV_NUM_PROCESSES)
    if size < 1 or not 0 <= index < size:
        raise ValueError(
            f"JOB_COMPLETION_INDEX={index} is out of range for {ENV_NUM_PROCESSES}={size}."
        )
    port = _int_env(environ, ENV_PORT, default=DEFAULT_KUBERNETES_PORT)
    job = env_vars.JOB_NAME.get(environ)
    if not job:
        hostname = Foreign.HOSTNAME.get(environ, "")
        suffix = f"-{index}"
        if not hostname.endswith(suffix):
            raise ValueError(
                f"Kubernetes Indexed Job: the pod's HOSTNAME {hostname!r} is not "
                f"'<job name>{suffix}'; set {ENV_JOB_NAME} to the Job's name."
            )
        job = hostname[: -len(suffix)]
    service = env_vars.SERVICE.get(environ)
    workers = tuple(f"{job}-{i}.{service}:{port}" for i in range(size))
    for address in workers:
        validate_address(address, f"{ENV_SERVICE}/{ENV_JOB_NAME}")
    return Cluster(index, size, workers if size > 1 else (), (), ROLE_WORKER, None,
                   "kubernetes", timeout, 0)


def validate_address(address, field):
    """Check that `address` is "host:port"; raise a ValueError naming `field`."""
    if not isinstance(address, str) or ":" not in address:
        raise ValueError(f"{field}: every address must be a 'host:port' string. Got: {address!r}")
    host, port = address.rsplit(":", 1)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{field}: invalid address (need 'host:port'). Got: {address!r}")


TRAINING_JOBS = ("chief", "worker")
SERVER_JOB = "ps"
KNOWN_JOBS = TRAINING_JOBS + (SERVER_JOB, "evaluator")


def parse_tf_config(text, timeout=DEFAULT_TIMEOUT_SECONDS):
    """Parse a `TF_CONFIG` JSON string into a `Cluster`.

    Raises:
        ValueError: naming the offending field when the JSON is malformed or
            inconsistent (unknown job, task index out of range, bad address,
            duplicate address, more than one chief, ...).
    """
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON ({e}). Got: {text!r}") from None
    if not isinstance(config, dict):
        raise ValueError(f"TF_CONFIG must be a JSON object. Got: {text!r}")
    cluster = config.get("cluster")
    task = config.get("task")
    if not isinstance(cluster, dict) or not cluster:
        raise ValueError(f"TF_CONFIG['cluster'] must be a non-empty object. Got: {cluster!r}")
    if not isinstance(task, dict):
        raise ValueError(f"TF_CONFIG['task'] must be an object with 'type' and 'index'. Got: {task!r}")

    seen = {}
    for job, addresses in cluster.items():
        if job not in KNOWN_JOBS:
            raise ValueError(
                f"TF_CONFIG['cluster'] has unknown job {job!r}; tfdist knows {list(KNOWN_JOBS)}."
            )
        if isinstance(addresses, dict):  # {"0": "host:port", ...} form of tf.train.ClusterSpec
            try:
                addresses = [addresses[k] for k in sorted(addresses, key=int)]
            except (ValueError, TypeError):
                raise ValueError(
                    f"TF_CONFIG['cluster'][{job!r}] has non-integer task keys. Got: {addresses!r}"
                ) from None
        if not isinstance(addresses, list) or not addresses:
            raise ValueError(
                f"TF_CONFIG['cluster'][{job!r}] must be a non-empty list of 'host:port'. "
                f"Got: {addresses!r}"
            )
        for i, address in enumerate(addresses):
            validate_address(address, f"TF_CONFIG['cluster'][{job!r}][{i}]")
            if address in seen:
                raise ValueError(
                    f"TF_CONFIG['cluster'][{job!r}][{i}] repeats address {address!r} "
                    f"already used by {seen[address]}."
                )
            seen[address] = f"{job}[{i}]"
        cluster[job] = addresses
    if len(cluster.get("chief", [])) > 1:
        raise ValueError(
            f"TF_CONFIG['cluster']['chief'] must have exactly one task. Got: {cluster['chief']!r}"
        )

    task_type = task.get("type")
    task_index = task.get("index", 0)
    if task_type not in cluster:
        raise ValueError(
            f"TF_CONFIG['task']['type'] must be one of the cluster's jobs {sorted(cluster)}. "
            f"Got: {task_type!r}"
        )
    if task_type == "evaluator":
        raise ValueError(
            "TF_CONFIG['task']['type'] is 'evaluator', which is not a training role; "
            "run the evaluator as a plain single process (without TF_CONFIG)."
        )
    if isinstance(task_index, bool) or not isinstance(task_index, int):
        raise ValueError(f"TF_CONFIG['task']['index'] must be an integer. Got: {task_index!r}")
    if not 0 <= task_index < len(cluster[task_type]):
        raise ValueError(
            f"TF_CONFIG['task']['index']={task_index} is out of range for job {task_type!r} "
            f"with {len(cluster[task_type])} task(s)."
        )

    workers = tuple(cluster.get("chief", [])) + tuple(cluster.get("worker", []))
    servers = tuple(cluster.get(SERVER_JOB, []))
    if not workers:
        raise ValueError("TF_CONFIG['cluster'] has no 'chief' or 'worker' job: nobody trains.")
    if task_type == SERVER_JOB:
        return Cluster(0, len(workers), workers, servers, ROLE_SERVER, task_index,
                       Foreign.TF_CONFIG.name, timeout)
    rank = task_index + (1 if task_type == "worker" and "chief" in cluster else 0)
    return Cluster(rank, len(workers), workers, servers, ROLE_WORKER, None,
                   Foreign.TF_CONFIG.name, timeout)
