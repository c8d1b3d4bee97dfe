"""Hand-written anchor: tfdist's `fit` step vs a `tf.function` loop written directly.

The same model (`overlap_step.build_model`, ~19 MB of gradients), the same
per-process batch and optimizer, in the same processes, interleaved round
by round (so machine noise hits both alike):

* fit      Keras' `model.fit` under `RingAllReduceStrategy(backend=BACKEND)`,
           default buckets;
* anchor   what an expert writes by hand: a `tf.function` that computes the
           gradients with a `GradientTape`, sums them in one fused engine
           call - `hvd.grouped_allreduce` (Horovod) or one
           `CollectiveReduceV2` of the concatenated gradients (TensorFlow
           collectives) - divides by P and applies them with the optimizer.
           Its own slice of the data, one batch per step from `tf.data`.

The TensorFlow server (collectives) or Horovod is started once, by the
strategy; the anchor only issues its own collectives on it.

Usage: anchor_step.py OUT.json BACKEND   (BACKEND: collective or horovod)
"""

import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)

import keras  # noqa: E402

import tfdist  # noqa: E402
from tfdist import _tf  # noqa: E402
from tfdist.comm.tf_collective import WORLD_GROUP_KEY  # noqa: E402
from harness import StepTimer  # noqa: E402  (this directory, run as a script)
from overlap_step import (PER_PROCESS_BATCH, build_model, compiled_model,  # noqa: E402
                          synthetic_data)

ROUNDS = 5  # the first round of each (tracing, warm-up) is discarded


def fused_sum(backend, communicator):
    """The hand-written gradient sum: one engine call for all gradients."""
    if backend == "horovod":
        import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel

        return lambda grads: hvd.grouped_allreduce(grads, op=hvd.Sum)
    key = communicator.instance_key()  # traced once: one instance, reused every step

    def collective_sum(grads):
        flat = tf.concat([tf.reshape(g, [-1]) for g in grads], axis=0)
        summed = _tf.all_reduce_v2(flat, communicator.world_size, WORLD_GROUP_KEY, key,
                                   communication_hint="ring", timeout=0.0)
        pieces = tf.split(summed, [g.shape.num_elements() for g in grads])
        return [tf.reshape(p, g.shape) for p, g in zip(pieces, grads)]

    return collective_sum


def anchor_step_function(model, optimizer, sum_gradients, world):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        grads = [g / world for g in sum_gradients(grads)]
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return step


def main():
    out, backend = sys.argv[1], sys.argv[2]
    strategy = tfdist.strategies.RingAllReduceStrategy(backend=backend)
    world, rank = strategy.world_size, strategy.rank
    keras.utils.set_random_seed(0)
    global_batch = PER_PROCESS_BATCH * world
    x, y = synthetic_data(world)
    model = compiled_model(strategy)
    anchor_model = build_model()
    step = anchor_step_function(anchor_model, keras.optimizers.SGD(0.01, momentum=0.9),
                                fused_sum(backend, strategy.extended.communicator), world)
    mine = tf.data.Dataset.from_tensor_slices((x, y)).shard(world, rank).batch(PER_PROCESS_BATCH)
    timer, anchor_times = StepTimer(), []
    for round_index in range(ROUNDS):
        model.fit(x, y, batch_size=global_batch, epochs=round_index + 1,
                  initial_epoch=round_index, verbose=0, callbacks=[timer])
        for xb, yb in mine:
            start = time.perf_counter()
            step(xb, yb)
            if round_index > 0:
                anchor_times.append(time.perf_counter() - start)
    if strategy.is_chief:
        fit_ms = statistics.median(timer.times) * 1e3
        anchor_ms = statistics.median(anchor_times) * 1e3
        result = {"backend": backend, "processes": world, "per_process_batch": PER_PROCESS_BATCH,
                  "fit_median_step_ms": fit_ms, "anchor_median_step_ms": anchor_ms,
                  "fit_over_anchor": fit_ms / anchor_ms,
                  "steps_timed": {"fit": len(timer.times), "anchor": len(anchor_times)}}
        with open(out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
