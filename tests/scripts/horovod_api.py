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
Then Horovod's own Keras tests, ported (horovod_ported.py). Writes
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("prefix")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--world-of-reference", type=int, default=2)
    parser.add_argument("--no-ported", dest="ported", action="store_false",
                        help="skip Horovod's ported Keras tests (horovod_ported.py)")
    parser.add_argument("--uneven", action="store_true",
                        help="the last rank gets one batch fewer (refused: a clear error)")
    args = parser.parse_args()
    hvd.init()
    results = {}
    for name in args.configs.split(","):
        run(name, args, results)
    collectives(results)
    if args.ported:
        import horovod_ported  # pylint: disable=import-outside-toplevel

        results["ported"] = np.array(horovod_ported.run_all())
    np.savez(f"{args.prefix}.rank{hvd.rank()}.npz", **results)
    print(f"rank {hvd.rank()} of {hvd.size()}: done", flush=True)


if __name__ == "__main__":
    main()
