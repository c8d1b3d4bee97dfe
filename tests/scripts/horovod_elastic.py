"""Worker script: Horovod's elastic Keras example (examples/elastic/tensorflow2/
tensorflow2_keras_mnist_elastic.py) in its structure, on synthetic data, with the import
changed to tfdist.horovod.keras.

    python horovod_elastic.py OUT [--epochs 4] [--steps 12] [--pause-at EPOCH:BATCH:SECONDS]

Every batch rank r prints "rank r pid P world W epoch E batch B" (E counted over the job's
runs, from the state); after EPOCH:BATCH it pauses SECONDS (in the first run at each size) so
a test can change the slots or kill a process. Rank 0 writes OUT.json at the end: the state's
epoch, the world size and restart count of the run that finished, and a checksum of the
weights.
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist.horovod.keras as hvd  # noqa: E402  (was: import horovod.tensorflow.keras as hvd)

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--pause-at", default=None)
args = parser.parse_args()

hvd.init()

rng = np.random.default_rng(100 + hvd.rank())
images = rng.normal(size=(256, 12, 12, 1)).astype("float32")
labels = rng.integers(0, 10, size=256).astype("int64")
dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().shuffle(256).batch(16)

model = tf.keras.Sequential([
    tf.keras.Input((12, 12, 1)),
    tf.keras.layers.Conv2D(8, [3, 3], activation="relu"),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Dropout(0.25),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(32, activation="relu"),
    tf.keras.layers.Dense(10, activation="softmax"),
])
scaled_lr = 0.001 * hvd.size()
opt = hvd.DistributedOptimizer(tf.optimizers.Adam(scaled_lr), backward_passes_per_step=1,
                               average_aggregated_gradients=True)
model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt,
              metrics=["accuracy"], experimental_run_tf_function=False)
model.fit(dataset, steps_per_epoch=1, epochs=1, callbacks=None, verbose=0)

state = hvd.elastic.KerasState(model, batch=0, epoch=0)


def on_state_reset():
    state.model.optimizer.learning_rate.assign(0.001 * hvd.size())


state.register_reset_callbacks([on_state_reset])


class Announce(tf.keras.callbacks.Callback):
    paused = False

    def on_train_batch_end(self, batch, logs=None):
        print(f"rank {hvd.rank()} pid {os.getpid()} world {hvd.size()} epoch {state.epoch} "
              f"batch {batch}", flush=True)
        if args.pause_at and not self.paused:
            epoch, at, seconds = args.pause_at.split(":")
            if state.epoch == int(epoch) and batch == int(at):
                self.paused = True
                time.sleep(float(seconds))


callbacks = [
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.CommitStateCallback(state),
    Announce(),
]


@hvd.elastic.run
def train(state):
    state.model.fit(dataset, steps_per_epoch=args.steps, epochs=args.epochs - state.epoch,
                    callbacks=callbacks, verbose=0)


train(state)

if hvd.rank() == 0:
    with open(args.out + ".json", "w") as f:
        json.dump({"epoch": state.epoch, "world": hvd.size(),
                   "restart": int(os.environ.get("TFDIST_RESTART_COUNT", "0")),
                   "checksum": float(sum(np.sum(w) for w in model.get_weights()))}, f)
