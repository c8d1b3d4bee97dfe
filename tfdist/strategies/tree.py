"""`ReductionTreeStrategy`: gradients summed up a k-ary tree and sent back down."""

from typing import Union

from tfdist.aggregation.compression import Compressor
from tfdist.aggregation.fusion import DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_GRADIENT_BUCKET_BYTES
from tfdist.aggregation.tree import (DEFAULT_CHUNK_BYTES, ReductionTreeAggregator,
                                    validate_fanout)
from tfdist import runtime
from tfdist.comm import engines
from tfdist.strategies.data_parallel import DataParallelStrategy
from tfdist.strategies import modes


class ReductionTreeStrategy(DataParallelStrategy):
    """Synchronous data parallelism with a reduction tree (FireCaffe) of the gradients.

    Each step, every process computes gradients on its slice of the global
    batch; the gradients are summed up a k-ary tree of the processes
    (heap order, rank 0 at the root) and the sum is sent back down, in
    pipelined chunks, over TensorFlow's in-graph point-to-point transfers.
    Every process then applies the same update as a single process on the
    whole batch. Any number of processes works; `fanout >= processes - 1` is
    a star around rank 0. Cost for n bytes over P processes with depth
    d = ceil(log_k((k - 1) P + 1)) - 1 and C chunks:
    2 (d + C - 1) (alpha + k n / C beta) (see `ReductionTreeAggregator`):
    fewer latency terms than the ring (log P instead of P), more bytes per
    level, so it suits small models and many processes.

    Args:
        fanout: children per tree node (k >= 2).
        chunk_bytes: size of the pipelined chunks (default 4 MiB).
        fusion_threshold_bytes: largest gradient bucket (default 4 MiB);
            buckets are issued in reverse layer order, as the backward pass
            produces them (see `RingAllReduceStrategy`).
        first_bucket_bytes: largest first bucket (default 1 MiB).
        compression: None, "fp16", "powersgd" or a `tfdist.compression`
            object whose messages add up (`FP16()`, `PowerSGD(rank=...)`);
            top-k and 1-bit gather every rank's message, which the tree
            cannot: refused with a clear error (use the ring).

    Example:

    ```python
    strategy = tfdist.strategies.ReductionTreeStrategy(fanout=2)
    with strategy.scope():
        model = keras.Sequential([...])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=256, epochs=10)   # launched by: tfdist-run -np 5 python train.py
    ```
    """

    def __init__(self, fanout: int = 2, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 fusion_threshold_bytes: int = DEFAULT_GRADIENT_BUCKET_BYTES,
                 compression: Union[str, Compressor, None] = None,
                 first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES,
                 shard_optimizer_state: bool = False):
        optimizer_state = modes.replicated_state_only(
            shard_optimizer_state, "ReductionTreeStrategy", runtime.cluster().rank,
            "the tree sums through its root and sends every rank the whole sum; sharding pairs "
            "the ring's all-reduce with its all-gather of the parameters")
        self.fanout = validate_fanout(fanout)
        super().__init__(
            lambda communicator: ReductionTreeAggregator(
                communicator, fanout, chunk_bytes, fusion_threshold_bytes,
                first_bucket_bytes),
            engine=engines.names(point_to_point=True)[0], compression=compression, optimizer_state=optimizer_state,
        )
