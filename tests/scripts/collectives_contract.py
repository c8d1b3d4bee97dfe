"""Worker script: the `Communicator` collectives keep their contract on a real engine.

Usage: python collectives_contract.py BACKEND   (under `tfdist-run --horovod -np P`)
Checks `all_gather_equal` (eager and inside a tf.function, float32, uint8
and bool), `all_gather` with rows that differ per rank and `broadcast`; rank 0
prints "collectives contract ok" when every check passed on every rank.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402


def main():
    strategy = tfdist.strategies.RingAllReduceStrategy(backend=sys.argv[1])
    comm, rank, world = strategy.extended.communicator, strategy.rank, strategy.world_size
    mine = tf.fill([2, 3], float(rank) + 0.5)
    bits = tf.constant([rank, 255 - rank], tf.uint8)

    @tf.function
    def traced(value):
        return comm.all_gather_equal(value)

    for gathered in (comm.all_gather_equal(mine), traced(mine)):
        assert gathered.shape == (world, 2, 3), gathered.shape
        np.testing.assert_array_equal(gathered.numpy()[:, 0, 0], np.arange(world) + 0.5)
    packed = comm.all_gather_equal(bits).numpy()
    assert packed.dtype == np.uint8 and packed.tolist() == [[r, 255 - r] for r in range(world)]
    signs = comm.all_gather_equal(tf.constant([[rank % 2 == 0] * 3])).numpy()  # bool, [1, 3]
    assert signs.shape == (world, 1, 3) and signs[:, 0, 0].tolist() == [
        r % 2 == 0 for r in range(world)]
    rows = comm.all_gather(tf.fill([rank + 1], rank)).numpy().tolist()
    assert rows == [r for r in range(world) for _ in range(r + 1)], rows
    assert comm.broadcast(tf.constant([7 * rank + 1])).numpy().tolist() == [1]
    agreed = comm.all_reduce(tf.constant([1.0])).numpy().tolist()
    assert agreed == [float(world)], agreed
    if rank == 0:
        print("collectives contract ok", flush=True)


if __name__ == "__main__":
    main()
