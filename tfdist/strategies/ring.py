"""`RingAllReduceStrategy`: gradients summed with a ring all-reduce."""

from typing import Optional, Union

from tfdist.aggregation.compression import Compressor
from tfdist import env_vars, runtime
from tfdist.aggregation.fusion import DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_GRADIENT_BUCKET_BYTES
from tfdist.aggregation.ring import RingAllReduceAggregator
from tfdist.comm import engines
from tfdist.comm.tf_collective import check_implementation
from tfdist.strategies.data_parallel import DataParallelStrategy
from tfdist.strategies import modes


def backends():
    """The `backend` values: "auto" and every registered engine (`tfdist.comm.engines`)."""
    return ("auto", *engines.ENGINES)


def resolve_backend(backend, bucket_bytes=DEFAULT_GRADIENT_BUCKET_BYTES):
    """(backend, why) for `backend`; why is None unless "auto" chose among engines (or, with
    TFDIST_VERBOSE=1, there are faster ones this job cannot run).

    "auto" is the fastest engine every rank of the job can run at buckets of `bucket_bytes`
    (`tfdist.comm.engines.choose`), as the ranks agreed at start-up
    (`runtime.job_agreement`): Open MPI's own collectives when the processes are one MPI
    job (tfdist-run with Open MPI installed, mpirun, srun with PMIx) and every rank's ops
    load; else Horovod on MPI or Gloo when its launcher gave Horovod the peers (horovodrun,
    tfdist-run with Horovod installed) and it imports on every rank; otherwise TensorFlow's
    collectives. An engine a faster choice would have been, which some rank cannot run, is
    named with that rank and its reason.
    """
    if backend not in backends():
        raise ValueError(f"backend must be one of {backends()}. Got: {backend!r}")
    if backend != "auto":
        return backend, None
    agreement = runtime.job_agreement()
    available = agreement.engines
    transport, why = engines.choose(available, bucket_bytes)
    reasons = [why] if len(available) > 1 else []  # one engine: nothing was chosen
    chosen = engines.relative_time(transport, bucket_bytes)
    reasons += [f"not {left}: {because}" for left, because in agreement.left_out.items()
                if engines.relative_time(left, bucket_bytes) < chosen]
    faster = engines.faster_engines(available, bucket_bytes)
    if faster and env_vars.VERBOSE.flag():
        reasons.append(f"faster: {faster}")
    return (engines.engine_of(transport),
            "backend 'auto': " + "; ".join(reasons) if reasons else None)


class RingAllReduceStrategy(DataParallelStrategy):
    """Synchronous data parallelism with ring all-reduce of the gradients.

    Each step, every process computes gradients on its slice of the global
    batch; the gradients are fused into reverse-order buckets, each summed
    with a ring all-reduce as soon as the backward pass has produced it, so
    every process applies the same update as a single process on the whole
    batch. Cost per bucket of n bytes over P processes:
    2 (P - 1) alpha + 2 (P - 1) / P n beta (see `RingAllReduceAggregator`).

    Args:
        backend: the engine that moves the bytes (the argument keeps Horovod's
            and tf.distribute's word; tfdist calls it the engine throughout):
            "collective" (TensorFlow's collective ops over gRPC),
            "mpi" (Open MPI's own collectives on the tensors' buffers, `tfdist.comm.mpi`;
            needs the processes started as one MPI job: tfdist-run with Open MPI
            installed, mpirun, srun --mpi=pmix),
            "horovod" (Horovod's ring over Gloo or MPI; needs horovodrun,
            mpirun or tfdist-run with Horovod installed), or "auto": the fastest engine
            the job can run by measured curves (`tfdist.comm.engines`:
            "mpi" in an MPI job, else Horovod when the launcher set it up, else
            "collective"), said in one start-up line.
        fusion_threshold_bytes: largest gradient bucket, i.e. fused buffer
            (default 4 MiB); for Horovod, also its HOROVOD_FUSION_THRESHOLD.
        first_bucket_bytes: largest first bucket (default 1 MiB): the last
            layers' gradients, summed while the backward pass goes on.
        compression: None; "fp16" / `tfdist.compression.FP16()`: float
            gradients travel as float16 and are cast back after the sum
            (half the bytes); `tfdist.compression.PowerSGD(rank=...)`,
            `TopK(ratio=...)`, `SignSGD()` (or their names, with defaults):
            lossy, with error feedback; any `tfdist.compression.Compressor`.
            Each compressor's module states its guarantee and cost.
        implementation: with the "collective" backend, TensorFlow's collective
            implementation: "auto" (GPU gradients summed with NCCL on their
            GPU, host tensors with the ring), "ring" (the ring everywhere) or
            "nccl" (as "auto": NCCL exists for GPU tensors only); see
            `tfdist.comm.tf_collective.collective_placement`. Process-wide:
            the communicator is shared by every strategy of the process.
        per_rank_input: each rank feeds its own data (Horovod's semantics, what
            `tfdist.horovod.keras` uses): batches are per rank, the global batch is
            every rank's together, variables are each rank's own until synchronized
            (`fit` starts from rank 0's); see `DataParallelStrategy`. Default False: the
            same global data on every rank, sliced by tfdist.
        shard_optimizer_state: ZeRO stage 1: each rank keeps the optimizer state
            (Adam's moments, momentum, EMA, accumulators) of 1/P of the parameters,
            updates those and the parameters are all-gathered after each step;
            training, evaluation and saved files equal the unsharded strategy's.
            Element-wise optimizers only; with "fp16" or no compression; on every
            engine ("collective" all-reduces where it has no reduce-scatter). Algorithm,
            guarantee and cost: `tfdist.strategies.modes.optimizer_shards`. The same as
            `sharding="optimizer"`.
        sharding: where the training state lives, one value as FSDP's
            `ShardingStrategy`: None (whole on every rank), "optimizer" (ZeRO stage 1:
            the optimizer state as 1/P slices), "gradients" (stage 2: the same placement
            here - a TensorFlow step keeps no gradient buffers, and stage 1 already
            reduce-scatters where the engine can; `modes.sharded_state.ShardedGradients`),
            or "parameters" (stage 3: each rank stores 1/P of every trainable variable,
            gathered where a layer reads it and reduce-scattered in the backward pass;
            for models whose parameters, gradients and state do not fit one process:
            `tfdist.strategies.modes.parameter_shards`). Training, evaluation and saved
            files equal the unsharded strategy's.
        reshard_after_forward: with sharding="parameters", as FSDP's: True (default) - a
            layer that owns parameters and no state is recomputed in the backward pass, so
            its gathered parameters do not live until then (one more forward pass and
            gather; the recomputed gradients differ from the forward's in rounding, which
            Adam can grow on near-zero gradients); False - they live until the backward
            pass (more memory; gradients bit for bit the unsharded strategy's).

    Example:

    ```python
    strategy = tfdist.strategies.RingAllReduceStrategy()
    with strategy.scope():
        model = keras.Sequential([...])
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, batch_size=256, epochs=10)   # launched by: tfdist-run -np 4 python train.py
    ```
    """

    def __init__(self, backend: str = "auto",
                 fusion_threshold_bytes: int = DEFAULT_GRADIENT_BUCKET_BYTES,
                 compression: Union[str, Compressor, None] = None,
                 first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES,
                 implementation: str = "auto", per_rank_input: bool = False,
                 shard_optimizer_state: bool = False, sharding: Optional[str] = None,
                 reshard_after_forward: Optional[bool] = None):
        placement = modes.placement(shard_optimizer_state, sharding,  # checked first
                                    reshard_after_forward)
        self.sharding = placement.sharding
        self.fusion_threshold_bytes = int(fusion_threshold_bytes)
        self.backend, why = resolve_backend(backend, self.fusion_threshold_bytes)
        self.implementation = check_implementation(implementation)  # refused before anything starts
        engine_options = engines.engine(self.backend).options(self.fusion_threshold_bytes,
                                                              implementation)
        super().__init__(
            lambda communicator: RingAllReduceAggregator(
                communicator, self.fusion_threshold_bytes, first_bucket_bytes),
            engine=self.backend, engine_options=engine_options, compression=compression,
            per_rank_input=per_rank_input, engine_reason=why,
            optimizer_state=placement,
        )
