"""Horovod's own TensorFlow 2 tests (test/parallel/test_tensorflow.py, Horovod 0.28.1) that apply
on CPUs, ported to `tfdist.horovod.tensorflow`; run inside tests/scripts/horovod_api.py's job.

Ported, each over Horovod's dtypes and 1-3 dimensional tensors, eagerly and in a `tf.function`:

* test_horovod_allreduce_cpu (Sum) and test_horovod_allreduce_average_cpu;
* test_horovod_grouped_allreduce_cpu;
* test_horovod_allgather_variable_size_fused_cpu: first dimensions that differ per rank;
* test_horovod_broadcast_cpu: every rank as the root, Horovod's small integer types included;
* test_horovod_broadcast_object / allgather_object;
* the DistributedGradientTape cases of test_tensorflow.py's optimizer tests: a variable's
  gradient averaged (op=Average) and summed (op=Sum), and a None gradient kept None.

Not ported: GPU and process-set variants, Adasum, alltoall, join and the timeline (not offered),
the error cases that need mismatched ranks (tfdist refuses them before the collective: other
tests), gradients through `hvd.allreduce` itself (tfdist's collectives are not differentiable;
gradients are reduced by DistributedGradientTape / DistributedOptimizer, as Horovod's examples
do).
"""

import itertools

import numpy as np
import tensorflow as tf

import tfdist.horovod.tensorflow as hvd

import horovod_ported  # the runner of Horovod's Keras tests (same folder)

DIMS = (1, 2, 3)


def _both(fn):
    """`fn` eagerly and as a `tf.function` (Horovod's tests run in both modes)."""
    return [fn, tf.function(fn)]


def test_horovod_allreduce_cpu():
    size = hvd.size()
    for dtype, dim in itertools.product((tf.int32, tf.int64, tf.float32, tf.float64), DIMS):
        tensor = tf.cast(tf.random.stateless_uniform([17] * dim, (1, dim), -100, 100), dtype)
        for run in _both(lambda t: hvd.allreduce(t, op=hvd.Sum)):
            summed = run(tensor)
            assert np.allclose(summed.numpy(), tensor.numpy() * size), (dtype, dim)


def test_horovod_allreduce_average_cpu():
    for dtype, dim in itertools.product((tf.float32, tf.float64), DIMS):
        tensor = tf.cast(tf.random.stateless_uniform([17] * dim, (2, dim), -100, 100), dtype)
        for run in _both(lambda t: hvd.allreduce(t, op=hvd.Average)):
            assert np.allclose(run(tensor).numpy(), tensor.numpy(), atol=1e-5), (dtype, dim)


def test_horovod_grouped_allreduce_cpu():
    size = hvd.size()
    for dtype, dim in itertools.product((tf.int32, tf.float32, tf.float64), DIMS):
        tensors = [tf.cast(tf.random.stateless_uniform([17] * dim, (3, i), -100, 100), dtype)
                   for i in range(5)]
        for run in _both(lambda ts: hvd.grouped_allreduce(ts, op=hvd.Sum)):
            for summed, tensor in zip(run(tensors), tensors):
                assert np.allclose(summed.numpy(), tensor.numpy() * size), (dtype, dim)


def test_horovod_allgather_variable_size_fused_cpu():
    rank, size = hvd.rank(), hvd.size()
    sizes = ([17, 32, 81, 12, 15, 23, 22] * 5)[:size]
    for dtype, dim in itertools.product((tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16,
                                         tf.float32, tf.float64), DIMS):
        tensor = tf.cast(tf.ones([sizes[rank]] + [17] * (dim - 1)) * rank, dtype)
        gathered = hvd.allgather(tensor).numpy()
        assert list(gathered.shape) == [sum(sizes)] + [17] * (dim - 1), (dtype, dim)
        for i in range(size):
            part = gathered[sum(sizes[:i]):sum(sizes[:i + 1])]
            assert (part.astype(np.int64) == i).all(), (dtype, dim, i)


def test_horovod_broadcast_cpu():
    rank, size = hvd.rank(), hvd.size()
    for dtype, dim, root in itertools.product((tf.uint8, tf.int8, tf.uint16, tf.int16,
                                               tf.int32, tf.int64, tf.float16, tf.float32,
                                               tf.float64), DIMS, range(size)):
        tensor = tf.cast(tf.ones([17] * dim) * rank, dtype)
        broadcast = hvd.broadcast(tensor, root)
        assert broadcast.dtype == dtype and (broadcast.numpy().astype(np.int64) == root).all()


def test_horovod_broadcast_object():
    rank, size = hvd.rank(), hvd.size()
    expected = {"hello": 123, 0: [1, 2]}
    assert hvd.broadcast_object(expected if rank == 0 else None, root_rank=0) == expected
    assert hvd.allgather_object({"rank": rank}) == [{"rank": r} for r in range(size)]


def test_distributed_gradient_tape():
    rank, size = hvd.rank(), hvd.size()
    variable = tf.Variable([1.0, 2.0])
    unused = tf.Variable(3.0)
    for op, expected in ((hvd.Average, np.mean(range(1, size + 1))),
                         (hvd.Sum, float(sum(range(1, size + 1))))):
        def gradients(op=op):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(variable) * float(rank + 1)
            return hvd.DistributedGradientTape(tape, op=op).gradient(loss, [variable, unused])

        for run in _both(gradients):
            grad, none = run()
            assert none is None
            assert np.allclose(grad.numpy(), [expected, expected]), (op, grad)


TESTS = (test_horovod_allreduce_cpu, test_horovod_allreduce_average_cpu,
         test_horovod_grouped_allreduce_cpu, test_horovod_allgather_variable_size_fused_cpu,
         test_horovod_broadcast_cpu, test_horovod_broadcast_object,
         test_distributed_gradient_tape)


def run_all():
    """Run every ported test; the names that passed (an assertion error stops the job)."""
    return horovod_ported.run_all(TESTS)
