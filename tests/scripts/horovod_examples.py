"""Horovod's two Keras examples as Horovod users run them, with only the documented changes.

Written for this suite in the shape of Horovod 0.28.1's examples (their code is not copied):

* `mnist`: examples/tensorflow2/tensorflow2_keras_mnist.py - a CNN with two Dropout layers
  and no seed anywhere (each rank draws its own masks, as in Horovod), `tf.data` repeated
  and shuffled, `DistributedOptimizer(backward_passes_per_step=1,
  average_aggregated_gradients=True)`, `compile(experimental_run_tf_function=False)`,
  `BroadcastGlobalVariablesCallback(0)`, `MetricAverageCallback()`,
  `LearningRateWarmupCallback`, a `ModelCheckpoint` on rank 0 only,
  `steps_per_epoch=N // hvd.size()`. The documented changes: the import line, the MNIST
  download replaced by generated images;
* `resume`: examples/keras/keras_imagenet_resnet50.py's resume - the newest checkpoint's
  epoch found on disk and broadcast from rank 0 (`hvd.broadcast`), rank 0 alone restoring
  with `hvd.load_model` while the others build and compile a fresh model, every rank then
  fitting from `initial_epoch` with `BroadcastGlobalVariablesCallback(0)`, checkpoints on
  rank 0 only, the score `hvd.allreduce`d. The documented changes: the import line, Keras 3's
  spellings (`fit` for `fit_generator`, `learning_rate=`, no `tf.Session`), a `.keras`
  checkpoint (Keras 3's `.h5` loader cannot give a restored optimizer back its variables),
  generated data, a small model.

    python horovod_examples.py mnist OUT_PREFIX
    python horovod_examples.py resume OUT_PREFIX CHECKPOINT_DIR EPOCHS

Each rank writes OUT_PREFIX.rank<r>.npz: its weights, its Dropout seed state, and (resume)
the epoch it resumed from and the weights it started from.
"""

import os
import sys

import numpy as np
import tensorflow as tf
import keras

import tfdist.horovod.keras as hvd


def mnist(prefix):
    hvd.init()
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    generated = np.random.default_rng(123)  # in place of the MNIST download
    mnist_images = generated.integers(0, 255, size=(512, 28, 28)).astype("uint8")
    mnist_labels = (mnist_images[:, 12:16, 12:16].mean(axis=(1, 2)) // 26).astype("int64")

    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32),
         tf.cast(mnist_labels, tf.int64)))
    dataset = dataset.repeat().shuffle(10000).batch(32)

    mnist_model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(8, [3, 3], activation="relu"),
        tf.keras.layers.Conv2D(16, [3, 3], activation="relu"),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])
    scaled_lr = 0.001 * hvd.size()
    opt = tf.optimizers.Adam(scaled_lr)
    opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1,
                                   average_aggregated_gradients=True)
    mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt,
                        metrics=["accuracy"], experimental_run_tf_function=False)
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1,
                                                 verbose=1),
    ]
    if hvd.rank() == 0:
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(prefix + "-checkpoint-{epoch}.h5"))
    verbose = 1 if hvd.rank() == 0 else 0
    history = mnist_model.fit(dataset, steps_per_epoch=24 // hvd.size(), callbacks=callbacks,
                              epochs=2, verbose=verbose)
    _write(prefix, mnist_model, loss=np.array(history.history["loss"]))


def resume(prefix, checkpoint_dir, epochs):
    hvd.init()
    checkpoint_format = os.path.join(checkpoint_dir, "checkpoint-{epoch}.keras")
    resume_from_epoch = 0
    for try_epoch in range(epochs, 0, -1):
        if os.path.exists(checkpoint_format.format(epoch=try_epoch)):
            resume_from_epoch = try_epoch
            break
    resume_from_epoch = int(hvd.broadcast(resume_from_epoch, 0, name="resume_from_epoch"))
    verbose = 1 if hvd.rank() == 0 else 0

    generated = np.random.default_rng(hvd.rank())  # each rank its own sample of the data
    x = generated.normal(size=(96, 16)).astype("float32")
    y = keras.utils.to_categorical((x[:, :4].sum(axis=1) > 0).astype("int64"), 2)
    initial_lr = 0.0125 * hvd.size()
    if resume_from_epoch > 0 and hvd.rank() == 0:
        model = hvd.load_model(checkpoint_format.format(epoch=resume_from_epoch))
    else:
        model = keras.Sequential([
            keras.Input((16,)),
            keras.layers.Dense(32, activation="relu",
                               kernel_regularizer=keras.regularizers.l2(0.00005)),
            keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5),
            keras.layers.Dense(2, activation="softmax"),
        ])
        opt = keras.optimizers.SGD(learning_rate=initial_lr, momentum=0.9)
        opt = hvd.DistributedOptimizer(opt)
        model.compile(loss=keras.losses.categorical_crossentropy, optimizer=opt,
                      metrics=["accuracy", "top_k_categorical_accuracy"])
    started = [np.array(w) for w in model.get_weights()]
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=initial_lr, warmup_epochs=1,
                                                 verbose=verbose),
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=initial_lr, multiplier=1.0,
                                                   start_epoch=1, end_epoch=3),
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=initial_lr, multiplier=1e-1,
                                                   start_epoch=3),
    ]
    if hvd.rank() == 0:
        callbacks.append(keras.callbacks.ModelCheckpoint(checkpoint_format))
    model.fit(x, y, batch_size=8, steps_per_epoch=12 // hvd.size(), callbacks=callbacks,
              epochs=epochs, verbose=verbose, initial_epoch=resume_from_epoch)
    score = hvd.allreduce(model.evaluate(x, y, verbose=0))
    _write(prefix, model, resumed_from=np.array(resume_from_epoch), score=np.array(score),
           **{f"started_{i}": w for i, w in enumerate(started)})


def _write(prefix, model, **extra):
    seeds = [v.numpy() for v in model.variables if "seed_generator_state" in v.path]
    arrays = {f"weight_{i}": np.array(w) for i, w in enumerate(model.get_weights())}
    arrays.update({f"seed_{i}": s for i, s in enumerate(seeds)}, **extra)
    np.savez(f"{prefix}.rank{hvd.rank()}.npz", **arrays)


if __name__ == "__main__":
    if sys.argv[1] == "mnist":
        mnist(sys.argv[2])
    else:
        resume(sys.argv[2], sys.argv[3], int(sys.argv[4]))
