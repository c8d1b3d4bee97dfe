"""`RingAllReduceStrategy`: gradients summed with a ring all-reduce."""

from absl import logging

from tfdist.aggregation.fusion import DEFAULT_BUCKET_BYTES
from tfdist.aggregation.ring import RingAllReduceAggregator
from tfdist.strategies.data_parallel import DataParallelStrategy

BACKENDS = ("auto", "horovod", "collective")


def resolve_backend(backend):
    """Pick the engine for `backend`; "auto" means the TF collective ring for now."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}. Got: {backend!r}")
    if backend == "horovod":
        raise NotImplementedError(
            "RingAllReduceStrategy(backend='horovod') is not available in this version; "
            "use backend='collective' (or 'auto')."
        )
    return "collective"


class RingAllReduceStrategy(DataParallelStrategy):
    """Synchronous data parallelism with ring all-reduce of the gradients.

    Each step, every process computes gradients on its slice of the global
    batch; the gradients are fused into buckets and summed with a ring
    all-reduce, so every process applies the same update as a single process
    on the whole batch. Cost per bucket of n bytes over P processes:
    2 (P - 1) alpha + 2 (P - 1) / P n beta (see `RingAllReduceAggregator`).

    Args:
        backend: "auto", "collective" (TensorFlow's collective ops over gRPC)
            or "horovod".
        fusion_threshold_bytes: largest fused gradient buffer (default 64 MiB).

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

    def __init__(self, backend="auto", fusion_threshold_bytes=DEFAULT_BUCKET_BYTES):
        self.backend = resolve_backend(backend)
        self.fusion_threshold_bytes = int(fusion_threshold_bytes)
        super().__init__(
            lambda communicator: RingAllReduceAggregator(communicator, self.fusion_threshold_bytes)
        )
        if self.is_chief and backend == "auto":
            logging.info("tfdist RingAllReduceStrategy: backend 'auto' resolved to %r",
                         self.backend)
