"""Worker script (run under `tfdist-run --horovod`): bytes one gradient all-reduce puts on the wire.

Usage: python wire_bytes.py OUT.json BACKEND
For compression "none" and "fp16", all-reduces a 16 MiB float32 gradient
through the strategy's gradient path (`batch_reduce_to`, as Keras' optimizers
do) several times and counts the loopback interface's bytes meanwhile; also
checks that the compressed sum is right. Rank 0 writes the counts.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from loopback import loopback_bytes  # noqa: E402  (this directory, run as a script)

REPEATS = 5
ELEMENTS = 4 << 20  # 16 MiB of float32


def main():
    out, backend = sys.argv[1], sys.argv[2]
    result = {}
    for compression in ("none", "fp16"):
        strategy = tfdist.strategies.RingAllReduceStrategy(backend=backend,
                                                           compression=compression)
        gradient = tf.random.stateless_uniform([ELEMENTS], seed=[strategy.rank, 1])

        @tf.function
        def reduce(g, strategy=strategy):
            return strategy.extended.batch_reduce_to(tf.distribute.ReduceOp.SUM, [(g, g)])[0]

        summed = reduce(gradient).numpy()
        expected = sum(tf.random.stateless_uniform([ELEMENTS], seed=[r, 1]).numpy()
                       for r in range(strategy.world_size))
        barrier = strategy.extended.communicator.barrier
        barrier()
        before = loopback_bytes()
        for _ in range(REPEATS):
            reduce(gradient).numpy()
        barrier()
        result[compression] = {
            "wire_bytes_per_all_reduce": (loopback_bytes() - before) / REPEATS,
            "payload_bytes": ELEMENTS * 4,
            "max_abs_error": float(np.max(np.abs(summed - expected))),
            "dtype": str(summed.dtype),
        }
    result["fp16_over_none"] = (result["fp16"]["wire_bytes_per_all_reduce"]
                                / result["none"]["wire_bytes_per_all_reduce"])
    if strategy.rank == 0:
        print(json.dumps(result), flush=True)
        with open(out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
