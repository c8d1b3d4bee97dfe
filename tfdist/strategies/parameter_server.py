"""`ParameterServerStrategy`: gradients summed by sharded parameter servers."""

from typing import Optional, Union

from tfdist.aggregation.compression import Compressor
from tfdist import chief_log, runtime
from tfdist.comm import engines
from tfdist.errors import ServerRoleFinished
from tfdist.aggregation.parameter_server import DEFAULT_PIECE_BYTES, ParameterServerAggregator
from tfdist.aggregation.parameter_server.colocated import ColocatedServer
from tfdist.strategies import modes
from tfdist.strategies.modes.asynchronous_updates import AsynchronousUpdates
from tfdist.strategies.data_parallel import DataParallelStrategy

MODES = ("sync", "async")


class ParameterServerStrategy(DataParallelStrategy):
    """Data parallelism through sharded parameter servers: synchronous, asynchronous or SSP.

    mode="sync": each step, every worker cuts its gradients into pieces spread evenly
    over the K servers, pushes them and pulls back their sums over all
    workers (`ParameterServerAggregator`); the Keras optimizer then runs on
    every worker, so any Keras optimizer works and every worker applies the
    same update as a single process on the whole batch. Cost per step for n
    bytes of gradients over P workers and K servers: 2 (m alpha + P n / K beta)
    with m = ceil(n / (K piece_bytes)) (see `ParameterServerAggregator`).

    mode="async": the servers hold the model's variables (whole variables,
    spread by bytes) and run the user's Keras optimizer - same class and
    configuration, its slots on the servers - applying each worker's
    gradients as they arrive (Downpour); each worker pulls fresh parameters
    before every step and pushes its gradients, weighted by 1 / P, after it
    (`tfdist.aggregation.parameter_server.async_client`). `staleness=None`
    lets workers run freely; `staleness=tau` is Stale Synchronous Parallel:
    a worker starting its step c waits until every worker has finished step
    c - tau (`staleness=0`: lock-step). During `fit` the logged training
    loss and metrics are this worker's own (on its slices, with the
    parameters it pulled); `evaluate` and `predict` wait for every worker
    and use the servers' current parameters, with global metrics.
    Optimizers with `global_clipnorm` or a LossScaleOptimizer are rejected
    (they span servers); schedules in the optimizer run on the servers.

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
        mode: "sync" or "async".
        staleness: "async" only: None (unbounded, Downpour) or an integer
            tau >= 0, the most steps a worker may run ahead of the slowest
            (SSP).
        piece_bytes: largest piece per message (default 1 MiB; gRPC caps
            messages at 4 MiB).
        compression: None or "fp16" (see `DataParallelStrategy`; the servers
            only sum and keep no per-worker state, so PowerSGD, top-k and
            1-bit are refused with a clear error).

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

    def __init__(self, num_servers: Optional[int] = None, mode: str = "sync",
                 staleness: Optional[int] = None, piece_bytes: int = DEFAULT_PIECE_BYTES,
                 compression: Union[str, Compressor, None] = None,
                 shard_optimizer_state: bool = False):
        optimizer_state = modes.replicated_state_only(
            shard_optimizer_state, "ParameterServerStrategy", runtime.cluster().rank,
            "its servers already keep the parameters and the optimizer state, each server its "
            "part, and no worker holds optimizer state")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}. Got: {mode!r}")
        if mode == "sync" and staleness is not None:
            raise ValueError(f"staleness applies to mode='async' only. Got: {staleness!r}")
        if staleness is not None and (isinstance(staleness, bool) or not isinstance(
                staleness, int) or staleness < 0):
            raise ValueError(f"staleness must be None or an integer >= 0. Got: {staleness!r}")
        cluster = runtime.cluster()
        if cluster.is_server:
            from tfdist.aggregation.parameter_server.server_process import run_server

            raise ServerRoleFinished(run_server(cluster).code)
        dedicated = cluster.server_addresses
        available = len(dedicated) or cluster.world_size
        if num_servers is not None and num_servers != available:
            where = (f"the cluster has {len(dedicated)} dedicated servers" if dedicated else
                     f"without dedicated servers every one of the {cluster.world_size} workers "
                     "hosts one")
            raise ValueError(f"num_servers={num_servers!r} does not match the cluster: {where}.")
        self.mode = mode
        self.staleness = staleness
        self.num_servers = available
        self.colocated = not dedicated
        self.piece_bytes = piece_bytes
        self._asynchronous_updates = AsynchronousUpdates(staleness) if mode == "async" else None
        # The workers' own collectives (broadcasts, metrics, barriers): Open MPI's in an MPI
        # job (no TensorFlow server listening on every interface), else TensorFlow's.
        engine = engines.MPI if runtime.mpi_engine_runs() else engines.COLLECTIVE
        super().__init__(self._make_aggregator, engine=engine, compression=compression,
                         optimizer_state=optimizer_state, updates=self._asynchronous_updates)

    def _make_aggregator(self, communicator):
        cluster = runtime.cluster()
        if self.colocated:
            addresses = runtime.close_at_exit(ColocatedServer(cluster, communicator)).addresses
        else:
            addresses = cluster.server_addresses
        chief_log.info(cluster.is_chief,
                       "tfdist ParameterServerStrategy: %d %s server(s) for %d worker(s): %s",
                       len(addresses), "co-located" if self.colocated else "dedicated",
                       cluster.world_size, ", ".join(addresses))
        aggregator = ParameterServerAggregator(cluster.rank, cluster.world_size, addresses,
                                               cluster.timeout, self.piece_bytes)
        if self._asynchronous_updates is not None:  # its client shares the servers' connections
            self._asynchronous_updates.connect(aggregator, cluster.rank, communicator)
        return aggregator
