"""A Horovod Keras script on `tfdist.horovod.keras`: per-rank shards, Horovod's optimizer and
callbacks, saved for comparison with one process on the concatenated batches.

Usage: python horovod_api.py PREFIX [--configs a,b] [--world-of-reference P] [--no-ported]
       [--uneven]

Each rank r of P takes, from every global batch of GLOBAL_BATCH rows, its
contiguous GLOBAL_BATCH / P rows (equal per-rank batches), and trains with
`hvd.DistributedOptimizer` + `BroadcastGlobalVariablesCallback(0)` +
`MetricAverageCallback()`, as Horovod's examples do. One process given the
whole data (`hvd.size() == 1`) is the reference: the same global batches.
`--world-of-reference P` tells the reference which world it stands for
(op=Sum multiplies the gradient by P: the reference multiplies its rate).
Then Horovod's TensorFlow 2 custom loop (`tfdist.horovod.tensorflow`:
DistributedGradientTape traced and eager, op=Sum, gradient_predivide_factor,
sparse gradients gathered or as dense, broadcast_variables after the first
step, a tf.train.Checkpoint written by rank 0 alone), then Horovod's own
Keras tests, ported (horovod_ported.py). Writes
PREFIX.rank<r>.npz: weights, history, evaluate, this rank's predictions,
the collectives' results and the ported tests that passed.
"""

import argparse

import numpy as np

import tfdist.horovod.keras as hvd

GLOBAL_BATCH = 12
ROWS = 48
EPOCHS = 2


def shard(array, rank, world):
    """Rank `rank`'s rows of every global batch (contiguous GLOBAL_BATCH / world rows)."""
    per_rank = GLOBAL_BATCH // world
    batches = array.reshape((-1, GLOBAL_BATCH) + array.shape[1:])
    return batches[:, rank * per_rank:(rank + 1) * per_rank].reshape((-1,) + array.shape[1:])


def data(kind):
    rng = np.random.RandomState(7)
    if kind == "tokens":
        x = rng.randint(0, 20, size=(ROWS, 5)).astype("int32")
        y = (x.sum(axis=1) % 2).astype("int32")
    else:
        x = rng.normal(size=(ROWS, 6)).astype("float32")
        y = (x @ rng.normal(size=(6,)) > 0).astype("int32")
    return x, y


def model_for(kind, keras):
    if kind == "tokens":
        return keras.Sequential([keras.Input((5,), dtype="int32"),
                                 keras.layers.Embedding(20, 4),
                                 keras.layers.GlobalAveragePooling1D(),
                                 keras.layers.Dense(2, activation="softmax")])
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(2, activation="softmax")])


# name: (data, optimizer factory (rate multiplier for op=Sum's reference), DistributedOptimizer
#        arguments, input kind)
CONFIGS = {
    "adam": ("dense", lambda keras, m: keras.optimizers.Adam(0.01), {}, "arrays"),
    "sgd_sum_tfdata": ("dense", lambda keras, m: keras.optimizers.SGD(0.05 * m, momentum=0.9),
                       {"op": "Sum"}, "tfdata"),
    "accumulate": ("dense", lambda keras, m: keras.optimizers.SGD(0.05),
                   {"backward_passes_per_step": 2, "average_aggregated_gradients": True},
                   "arrays"),
    "sparse_as_dense": ("tokens", lambda keras, m: keras.optimizers.Adam(0.01),
                        {"sparse_as_dense": True}, "arrays"),
}


def run(name, args, results):
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    kind, make_optimizer, options, feed = CONFIGS[name]
    world, rank = hvd.size(), hvd.rank()
    reference = args.world_of_reference if world == 1 else world
    keras.utils.set_random_seed(1)
    x, y = data(kind)
    x, y = shard(x, rank, world), shard(y, rank, world)
    per_rank = GLOBAL_BATCH // world
    if args.uneven and rank == world - 1:  # one batch fewer on the last rank
        x, y = x[:-per_rank], y[:-per_rank]
    model = model_for(kind, keras)
    options = dict(options)
    if options.get("op") == "Sum":
        options["op"] = hvd.Sum
        multiplier = reference if world == 1 else 1  # Sum = size x the average
    else:
        multiplier = 1
    optimizer = hvd.DistributedOptimizer(make_optimizer(keras, multiplier), **options)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], experimental_run_tf_function=False)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback()]
    # Horovod's advice: checkpoints on worker 0 only - in each Keras 3 format (a .keras file
    # makes Keras build an optimizer on rank 0 alone: it must wait for no other rank).
    checkpoints = {
        "keras": keras.callbacks.ModelCheckpoint(f"{args.prefix}.{name}.{{epoch}}.keras"),
        "weights": keras.callbacks.ModelCheckpoint(f"{args.prefix}.{name}.weights.h5",
                                                   save_weights_only=True),
        "best": hvd.callbacks.BestModelCheckpoint(monitor="loss",
                                                  filepath=f"{args.prefix}.{name}.best.keras"),
        "h5": keras.callbacks.ModelCheckpoint(f"{args.prefix}.{name}.h5"),
    }
    if rank == 0:
        callbacks.append(checkpoints[CHECKPOINT_FORMATS[name]])
    if feed == "tfdata":
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(per_rank)
        history = model.fit(dataset, epochs=EPOCHS, callbacks=callbacks, verbose=0)
    else:
        history = model.fit(x, y, batch_size=per_rank, epochs=EPOCHS, shuffle=False,
                            callbacks=callbacks, verbose=0)
    for key, values in history.history.items():
        results[f"{name}/history/{key}"] = np.array(values)
    for index, weight in enumerate(model.get_weights()):
        results[f"{name}/w{index}"] = weight
    results[f"{name}/evaluate"] = np.array(model.evaluate(x, y, batch_size=per_rank, verbose=0))
    results[f"{name}/predict_rows"] = np.array(model.predict(x, batch_size=per_rank,
                                                             verbose=0).shape[0])
    if rank == 0:  # after fit, on rank 0 alone: a save, a load, a new optimizer
        model.save(f"{args.prefix}.{name}.final.keras")
        loaded = keras.models.load_model(f"{args.prefix}.{name}.final.keras")
        worst = max(float(np.max(np.abs(a - b)))
                    for a, b in zip(loaded.get_weights(), model.get_weights()))
        assert worst == 0.0, f"{name}: the loaded model differs by {worst}"
        keras.optimizers.SGD(0.1)


# The checkpoint callback each configuration runs on rank 0 only (every format in one launch).
CHECKPOINT_FORMATS = {"adam": "keras", "sgd_sum_tfdata": "weights", "accumulate": "best",
                      "sparse_as_dense": "h5"}

# Horovod's TensorFlow 2 custom loop (tensorflow2_mnist.py's step) on tfdist.horovod.tensorflow:
# name: (data, optimizer factory, DistributedGradientTape arguments, traced)
LOOPS = {
    "loop_adam_traced": ("dense", lambda keras, m: keras.optimizers.Adam(0.01), {}, True),
    "loop_sgd_sum_eager": ("dense", lambda keras, m: keras.optimizers.SGD(0.05 * m),
                           {"op": "Sum"}, False),
    "loop_predivide_traced": ("dense", lambda keras, m: keras.optimizers.SGD(0.05, momentum=0.9),
                              {"gradient_predivide_factor": 2.0}, True),
    "loop_sparse_traced": ("tokens", lambda keras, m: keras.optimizers.Adam(0.01), {}, True),
    "loop_sparse_as_dense_eager": ("tokens", lambda keras, m: keras.optimizers.SGD(0.1),
                                   {"sparse_as_dense": True}, False),
    # no DistributedGradientTape: hvd.DistributedOptimizer's apply_gradients averages
    "loop_distributed_optimizer_traced": ("dense", lambda keras, m: keras.optimizers.Adam(0.01),
                                          {"distributed_optimizer": True}, True),
}


def run_loop(name, args, results):
    """Horovod's custom loop: DistributedGradientTape, broadcast_variables after the first
    step (model and optimizer), a tf.train.Checkpoint written by rank 0 alone."""
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import tfdist.horovod.tensorflow as hvd_tf  # pylint: disable=import-outside-toplevel

    kind, make_optimizer, options, traced = LOOPS[name]
    world, rank = hvd_tf.size(), hvd_tf.rank()
    reference = args.world_of_reference if world == 1 else world
    options = dict(options)
    multiplier = 1
    if options.get("op") == "Sum":
        options["op"] = hvd_tf.Sum
        multiplier = reference if world == 1 else 1  # Sum = size x the average
    keras.utils.set_random_seed(1)
    x, y = data(kind)
    x, y = shard(x, rank, world), shard(y, rank, world)
    per_rank = GLOBAL_BATCH // world
    model = model_for(kind, keras)
    optimizer = make_optimizer(keras, multiplier)
    wrap_optimizer = options.pop("distributed_optimizer", False)
    if wrap_optimizer:
        optimizer = hvd_tf.DistributedOptimizer(optimizer)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    def step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            loss_value = loss_fn(labels, model(images, training=True))
        if not wrap_optimizer:
            tape = hvd_tf.DistributedGradientTape(tape, **options)
        grads = tape.gradient(loss_value, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            hvd_tf.broadcast_variables(model.variables, root_rank=0)
            hvd_tf.broadcast_variables(optimizer.variables, root_rank=0)
        return loss_value

    if traced:
        step = tf.function(step)
    losses = []
    for epoch in range(EPOCHS):
        for start in range(0, len(x), per_rank):
            losses.append(float(hvd_tf.allreduce(step(
                x[start:start + per_rank], y[start:start + per_rank],
                epoch == 0 and start == 0))))
    results[f"{name}/losses"] = np.array(losses)
    for index, weight in enumerate(model.get_weights()):
        results[f"{name}/w{index}"] = weight
    if rank == 0:  # Horovod's advice: checkpoints on worker 0 only
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        path = checkpoint.save(f"{args.prefix}.{name}.ckpt")
        restored = model_for(kind, keras)
        restored(x[:1])
        tf.train.Checkpoint(model=restored).restore(path).expect_partial()
        worst = max(float(np.max(np.abs(a - b)))
                    for a, b in zip(restored.get_weights(), model.get_weights()))
        assert worst == 0.0, f"{name}: the restored checkpoint differs by {worst}"


def collectives(results):
    world, rank = hvd.size(), hvd.rank()
    results["allreduce_average"] = hvd.allreduce(np.full([3], float(rank))).numpy()
    results["allreduce_sum"] = hvd.allreduce(np.full([3], float(rank)), op=hvd.Sum).numpy()
    results["allreduce_max"] = hvd.allreduce(np.full([3], float(rank)), op=hvd.Max).numpy()
    results["allgather"] = hvd.allgather(np.full([rank + 1, 2], rank)).numpy()
    results["broadcast"] = hvd.broadcast(np.full([2], float(rank + 10)), world - 1).numpy()
    small = hvd.broadcast(np.full([3], 200 + rank, np.uint8), 0)  # a type TF's collectives lack
    assert small.dtype == np.uint8, small.dtype
    results["broadcast_uint8"] = small.numpy()
    results["reducescatter"] = hvd.reducescatter(np.arange(5.0) * (rank + 1), op=hvd.Sum).numpy()
    results["topology"] = np.array([hvd.size(), hvd.rank(), hvd.local_size(), hvd.local_rank(),
                                    hvd.cross_size(), hvd.cross_rank()])
    import tfdist.horovod.tensorflow as hvd_tf  # pylint: disable=import-outside-toplevel

    assert hvd_tf.broadcast_object({"from": rank}, root_rank=world - 1) == {"from": world - 1}
    gathered = hvd_tf.allgather_object(("rank", rank) * (rank + 1))  # of other lengths
    assert gathered == [("rank", r) * (r + 1) for r in range(world)], gathered
    results["objects"] = np.array([world])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("prefix")
    parser.add_argument("--configs", default=",".join(list(CONFIGS) + list(LOOPS)))
    parser.add_argument("--world-of-reference", type=int, default=2)
    parser.add_argument("--no-ported", dest="ported", action="store_false",
                        help="skip Horovod's ported Keras tests (horovod_ported.py)")
    parser.add_argument("--uneven", action="store_true",
                        help="the last rank gets one batch fewer (refused: a clear error)")
    args = parser.parse_args()
    hvd.init()
    results = {}
    for name in args.configs.split(","):
        (run_loop if name in LOOPS else run)(name, args, results)
    collectives(results)
    if args.ported:
        import horovod_ported  # pylint: disable=import-outside-toplevel

        results["ported"] = np.array(horovod_ported.run_all())
        import horovod_tf_ported  # pylint: disable=import-outside-toplevel

        results["ported_tf"] = np.array(horovod_tf_ported.run_all())
    np.savez(f"{args.prefix}.rank{hvd.rank()}.npz", **results)
    print(f"rank {hvd.rank()} of {hvd.size()}: done", flush=True)


if __name__ == "__main__":
    main()
