"""Who am I, who are my peers: cluster discovery for every launcher tfdist supports.

Sources are tried in this order, and the first one present wins:

1. the `tfdist-run` environment (`TFDIST_RANK`, `TFDIST_WORLD_SIZE`, ...);
2. the `horovodrun` environment (`HOROVOD_RANK`, `HOROVOD_SIZE`, ...); peer
   addresses for tfdist's own transports are exchanged later through Horovod;
3. `TF_CONFIG` (Kubeflow TFJob / tf.distribute convention, jobs `chief`,
   `worker` and `ps`); training processes are the chief (rank 0, if present)
   followed by the workers in index order; `ps` tasks are parameter servers;
4. otherwise a single process.

Example:

```python
cluster = tfdist.cluster.discover()
print(cluster.rank, cluster.world_size, cluster.is_chief)
```
"""

import dataclasses
import json
import os

DEFAULT_TIMEOUT_SECONDS = 300.0

# Environment variables set by `tfdist-run` for each process it starts.
ENV_RANK = "TFDIST_RANK"
ENV_WORLD_SIZE = "TFDIST_WORLD_SIZE"
ENV_LOCAL_RANK = "TFDIST_LOCAL_RANK"
ENV_WORKER_ADDRESSES = "TFDIST_WORKER_ADDRESSES"
ENV_SERVER_ADDRESSES = "TFDIST_SERVER_ADDRESSES"
ENV_ROLE = "TFDIST_ROLE"
ENV_SERVER_INDEX = "TFDIST_SERVER_INDEX"
ENV_TIMEOUT = "TFDIST_TIMEOUT"

ROLE_WORKER = "worker"
ROLE_SERVER = "server"


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
            "horovodrun", "TF_CONFIG" or "single".
        timeout: seconds any blocking wait for a peer may last.
        local_rank: index of this process among those on its host.
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

    @property
    def is_chief(self):
        """True for the training process that logs and writes checkpoints."""
        return self.role == ROLE_WORKER and self.rank == 0

    @property
    def is_server(self):
        return self.role == ROLE_SERVER


def discover(environ=None):
    """Describe this process's cluster from the environment (see module doc)."""
    environ = os.environ if environ is None else environ
    timeout = _parse_timeout(environ)
    if ENV_RANK in environ or ENV_ROLE in environ:
        return _from_tfdist_run(environ, timeout)
    if "HOROVOD_RANK" in environ:
        return _from_horovodrun(environ, timeout)
    if environ.get("TF_CONFIG", "").strip():
        return parse_tf_config(environ["TF_CONFIG"], timeout=timeout)
    return Cluster(timeout=timeout)


def _parse_timeout(environ):
    raw = environ.get(ENV_TIMEOUT)
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
    role = environ.get(ENV_ROLE, ROLE_WORKER)
    if role not in (ROLE_WORKER, ROLE_SERVER):
        raise ValueError(f"{ENV_ROLE} must be 'worker' or 'server'. Got: {role!r}")
    world_size = _int_env(environ, ENV_WORLD_SIZE)
    workers = _address_list(environ.get(ENV_WORKER_ADDRESSES, ""), ENV_WORKER_ADDRESSES)
    servers = _address_list(environ.get(ENV_SERVER_ADDRESSES, ""), ENV_SERVER_ADDRESSES)
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
    rank = _int_env(environ, "HOROVOD_RANK")
    size = _int_env(environ, "HOROVOD_SIZE")
    local_rank = _int_env(environ, "HOROVOD_LOCAL_RANK", default=0)
    if not 0 <= rank < size:
        raise ValueError(f"HOROVOD_RANK={rank} is out of range for HOROVOD_SIZE={size}.")
    return Cluster(rank, size, (), (), ROLE_WORKER, None, "horovodrun", timeout, local_rank)


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
        return Cluster(0, len(workers), workers, servers, ROLE_SERVER, task_index, "TF_CONFIG", timeout)
    rank = task_index + (1 if task_type == "worker" and "chief" in cluster else 0)
    return Cluster(rank, len(workers), workers, servers, ROLE_WORKER, None, "TF_CONFIG", timeout)
