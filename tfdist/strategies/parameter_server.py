"""`ParameterServerStrategy`: gradients summed by sharded parameter servers."""

import atexit
import os
import subprocess
import sys

from tfdist import runtime
from tfdist.aggregation.parameter_server import DEFAULT_PIECE_BYTES, ParameterServerAggregator
from tfdist.errors import ClusterError
from tfdist.launch.ports import pick_ports
from tfdist.launch.processes import die_with_parent
from tfdist.strategies.data_parallel import DataParallelStrategy

MODES = ("sync", "async")


class ParameterServerStrategy(DataParallelStrategy):
    """Synchronous data parallelism through sharded parameter servers.

    Each step, every worker cuts its gradients into pieces spread evenly
    over the K servers, pushes them and pulls back their sums over all
    workers (`ParameterServerAggregator`); the Keras optimizer then runs on
    every worker, so any Keras optimizer works and every worker applies the
    same update as a single process on the whole batch. Cost per step for n
    bytes of gradients over P workers: 2 (alpha + P n / K beta).

    Servers are either
    * dedicated processes: `tfdist-run -np N --num-servers K`, or the `ps`
      tasks of a `TF_CONFIG` cluster. They run the same script: creating this
      strategy in a server process serves the shard until all workers are
      done and then exits the process (`python -m tfdist.server` starts a
      server without a script);
    * or co-located, when the cluster has no dedicated servers (e.g. under
      horovodrun): every worker also hosts one shard server, so K = P.

    Args:
        num_servers: expected number of servers (None: whatever the cluster
            has; checked against it otherwise).
        mode: "sync" (the asynchronous modes are not available yet).
        staleness: must be None in "sync" mode.
        piece_bytes: largest piece per message (default 1 MiB; gRPC caps
            messages at 4 MiB).
        compression: None or "fp16" (see `RingAllReduceStrategy`).

    Example:

    ```python
    strategy = tfdist.strategies.ParameterServerStrategy()
    with strategy.scope():
        model = keras.Sequential([...])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=256, epochs=10)
    # launched by: tfdist-run -np 4 --num-servers 2 python train.py
    ```
    """

    def __init__(self, num_servers=None, mode="sync", staleness=None,
                 piece_bytes=DEFAULT_PIECE_BYTES, compression=None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}. Got: {mode!r}")
        if mode != "sync":
            raise NotImplementedError(
                "ParameterServerStrategy: only mode='sync' is available in this version.")
        if staleness is not None:
            raise ValueError(f"staleness applies to mode='async' only. Got: {staleness!r}")
        cluster = runtime.cluster()
        if cluster.is_server:
            from tfdist.server import run_server

            sys.exit(run_server(cluster))
        dedicated = cluster.server_addresses
        available = len(dedicated) or cluster.world_size
        if num_servers is not None and num_servers != available:
            where = (f"the cluster has {len(dedicated)} dedicated servers" if dedicated else
                     f"without dedicated servers every one of the {cluster.world_size} workers "
                     "hosts one")
            raise ValueError(f"num_servers={num_servers!r} does not match the cluster: {where}.")
        self.mode = mode
        self.num_servers = available
        self.colocated = not dedicated
        self.piece_bytes = piece_bytes
        super().__init__(self._make_aggregator, engine="collective", compression=compression)

    def _make_aggregator(self, communicator):
        cluster = runtime.cluster()
        if self.colocated:
            addresses = _start_colocated_server(cluster, communicator)
        else:
            addresses = cluster.server_addresses
        if cluster.is_chief:
            print(f"tfdist ParameterServerStrategy: {len(addresses)} "
                  f"{'co-located' if self.colocated else 'dedicated'} server(s) for "
                  f"{cluster.world_size} worker(s): {', '.join(addresses)}",
                  file=sys.stderr, flush=True)
        aggregator = ParameterServerAggregator(cluster.rank, cluster.world_size, addresses,
                                               cluster.timeout, self.piece_bytes)
        if communicator is not None:
            # At exit, peers finishing first is not a failure: stop watching them before the
            # goodbyes and the wait for co-located servers (atexit runs last-in first-out).
            atexit.register(communicator.stop_monitor)
        return aggregator


def _start_colocated_server(cluster, communicator):
    """Start this worker's shard server as a child process; return every worker's server.

    A separate process, not a thread: the server's functions then never run
    beside this process's tracing of the training functions.
    """
    if communicator is None:
        raise ClusterError("tfdist: a single process has no parameter server to co-locate.")
    host = cluster.worker_addresses[cluster.rank].rsplit(":", 1)[0]
    address = f"{host}:{pick_ports(1, host='')[0]}"
    name = f"parameter server {cluster.rank} ({address}, on rank {cluster.rank})"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TFDIST_", "HOROVOD_"))}
    env.update(TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    env.pop("TF_CONFIG", None)
    child = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-m", "tfdist.server", "--address", address, "--name", name,
         "--num-workers", str(cluster.world_size), "--worker-addresses",
         ",".join(cluster.worker_addresses), "--timeout", str(cluster.timeout)],
        env=env, preexec_fn=die_with_parent)

    def wait_for_server():
        # Peers may still be pulling sums from this server: it exits once all said goodbye.
        try:
            child.wait(timeout=cluster.timeout)
        except subprocess.TimeoutExpired:
            child.kill()

    atexit.register(wait_for_server)  # runs after the aggregator's goodbye (atexit is LIFO)
    return communicator.all_gather_strings(address)
