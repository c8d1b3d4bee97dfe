"""Worker script: the `Communicator` collectives keep their contract on a real engine.

Usage: python collectives_contract.py BACKEND   (under `tfdist-run --horovod -np P`)
Checks `all_gather_equal` (eager and inside a tf.function, float32, uint8
and bool), `all_gather` with rows that differ per rank (none on rank 0), `broadcast`
(from rank 0 and from the last rank), `all_reduce` of every dtype a strategy sums
(float16, bfloat16, float32, float64, int32, int64, bool), eager and as many buckets of
different sizes in one tf.function, and `reduce_scatter` where the engine has it; rank 0
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
    empty_on_zero = comm.all_gather(tf.fill([0 if rank == 0 else 2, 2], rank)).numpy()
    assert empty_on_zero.shape == (2 * (world - 1), 2), empty_on_zero.shape
    last = world - 1
    assert comm.broadcast(tf.constant([3.0 * rank, 1.0]), root=last).numpy().tolist() == [
        3.0 * last, 1.0]
    triangle = world * (world + 1) // 2  # sum over ranks of rank + 1
    horovod = comm.engine == "horovod"  # Horovod's all-reduce takes no bfloat16 and no bool
    for dtype in (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64) + (
            () if horovod else (tf.bfloat16,)):
        total = comm.all_reduce(tf.cast(tf.fill([5], rank + 1), dtype)).numpy()
        assert total.tolist() == [triangle] * 5, (dtype, total)
    if not horovod:
        assert comm.all_reduce(tf.constant([True, rank == 0])).numpy().tolist() == [True, True]

    @tf.function
    def buckets(value):  # several sums in one step, of different sizes, as a ring's buckets
        return [comm.all_reduce(value[:size] * 1.0) for size in (7, 1000, 3, 100_000, 1)]

    for _ in range(2):
        sums = buckets(tf.fill([100_000], float(rank + 1)))
        assert [s.numpy().tolist() == [float(triangle)] * len(s) for s in sums] == [True] * 5
    if comm.reduces_scatter:
        part = comm.reduce_scatter(tf.range(4.0 * world) * (rank + 1)).numpy()
        expected = np.arange(4.0 * world)[4 * rank:4 * (rank + 1)] * triangle
        np.testing.assert_array_equal(part, expected)
    if rank == 0:
        print("collectives contract ok", flush=True)


if __name__ == "__main__":
    main()
