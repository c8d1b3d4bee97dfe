"""Worker script for the asynchronous parameter server: writes OUT.rank<R>.json.

  python async_training.py OUT constant [--staleness TAU] [--straggler RANK]
      A linear model whose gradient does not depend on its weights (loss =
      mean of the outputs), SGD: wherever and whenever each update is applied,
      the weights end at w0 - lr * sum of the gradients, as on one process, if
      no update is lost or applied twice.
  python async_training.py OUT real [--staleness TAU]
      An MLP with Adam on a synthetic classification task: fit (with
      validation), evaluate, predict and save on the chief.
  python async_training.py OUT momentum --backup DIR [--staleness TAU] [--announce]
      The linear model on rows that are all alike, so every push carries the
      same gradient, with SGD + momentum on a cosine schedule and
      `BackupAndRestore(DIR, save_freq=4)`: wherever and whenever the pushes
      are applied, the weights end where n steps of that optimizer on one
      variable end, n being the servers' step count - across a backup and a
      resume only if the servers' momentum and step count were restored.

--straggler RANK: that worker sleeps STRAGGLER_SECONDS per batch.
--die RANK: that worker kills itself (SIGKILL) in the second epoch.
--announce: print "rank R pid P step S" after each step, and pause 0.5 s after
step ANNOUNCE_PAUSE_STEP (time for a test to signal it).
"""

import argparse
import json
import os
import signal
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402

STRAGGLER_SECONDS = 0.05
ROWS, FEATURES, BATCH, EPOCHS, RATE = 96, 4, 12, 3, 0.1
ANNOUNCE_PAUSE_STEP = 10


class Straggler(keras.callbacks.Callback):
    def __init__(self, slow):
        super().__init__()
        self.slow = slow

    def on_train_batch_begin(self, batch, logs=None):
        if self.slow:
            time.sleep(STRAGGLER_SECONDS)


class Die(keras.callbacks.Callback):
    def __init__(self, dies):
        super().__init__()
        self.dies, self.epoch = dies, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.dies and self.epoch == 1 and batch == 2:
            print("dying on purpose", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


class Announce(keras.callbacks.Callback):
    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def on_train_batch_end(self, batch, logs=None):
        taken = int(self.model.optimizer.iterations.numpy())
        print(f"rank {self.rank} pid {os.getpid()} step {taken}", flush=True)
        if taken == ANNOUNCE_PAUSE_STEP:
            time.sleep(0.5)


class Linear(keras.layers.Layer):
    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], 1), initializer="ones")

    def call(self, x):
        return tf.matmul(x, self.w)


def mean_output(y_true, y_pred):
    del y_true
    return tf.reduce_mean(y_pred)


def constant(strategy, callbacks):
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), Linear()])
        model.compile(optimizer=keras.optimizers.SGD(RATE), loss=mean_output)
    x = np.arange(ROWS * FEATURES, dtype="float32").reshape(ROWS, FEATURES) / 100.0
    history = model.fit(x, np.zeros((ROWS, 1), "float32"), batch_size=BATCH, epochs=EPOCHS,
                        shuffle=False, verbose=0, callbacks=callbacks)
    # One process: every step subtracts lr x the mean row of its global batch.
    expected = 1.0 - RATE * EPOCHS * x.reshape(-1, BATCH, FEATURES).mean(axis=1).sum(axis=0)
    return {"weights": model.get_weights()[0].ravel().tolist(),
            "expected": expected.tolist(), "history": history.history}


def momentum(strategy, callbacks, backup):
    def optimizer():
        return keras.optimizers.SGD(keras.optimizers.schedules.CosineDecay(
            RATE, decay_steps=2 * EPOCHS * ROWS // BATCH), momentum=0.9)

    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), Linear()])
        model.compile(optimizer=optimizer(), loss=mean_output)
    x = np.full((ROWS, FEATURES), 0.5, "float32")
    history = model.fit(x, np.zeros((ROWS, 1), "float32"), batch_size=BATCH, epochs=EPOCHS,
                        shuffle=False, verbose=0, callbacks=callbacks + [
                            keras.callbacks.BackupAndRestore(backup, save_freq=4)])
    # The servers' step count; then n steps of the optimizer on one variable, each with the
    # gradient a push carries (the mean row, weighted by 1 / P).
    steps = sum(strategy.extended.updates.client.fetch_state(model.optimizer)["iterations"])
    variable = keras.Variable(np.ones((FEATURES, 1), "float32"))
    alone = optimizer()
    gradient = tf.constant(np.full((FEATURES, 1), 0.5 / strategy.world_size, "float32"))
    for _ in range(steps):
        alone.apply([gradient], [variable])
    return {"weights": model.get_weights()[0].ravel().tolist(), "server_steps": steps,
            "expected": variable.numpy().ravel().tolist(), "history": history.history}


def real(strategy, callbacks):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(480, 8)).astype("float32")
    y = (x[:, :4].sum(axis=1) > 0).astype("int32")
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    history = model.fit(x[:384], y[:384], batch_size=32, epochs=4, verbose=0,
                        validation_data=(x[384:], y[384:]), callbacks=callbacks)
    evaluation = model.evaluate(x[384:], y[384:], batch_size=32, verbose=0, return_dict=True)
    predictions = model.predict(x[:10], batch_size=5, verbose=0)
    return {"history": history.history, "evaluate": evaluation,
            "predictions": predictions.tolist(),
            "weights": [w.ravel().tolist() for w in model.get_weights()]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("job", choices=["constant", "real", "momentum"])
    parser.add_argument("--backup")
    parser.add_argument("--announce", action="store_true")
    parser.add_argument("--staleness", default="none")
    parser.add_argument("--straggler", type=int, default=-1)
    parser.add_argument("--staleness-aware", action="store_true")
    parser.add_argument("--die", type=int, default=-1)
    args = parser.parse_args()
    staleness = None if args.staleness == "none" else int(args.staleness)
    strategy = tfdist.strategies.ParameterServerStrategy(mode="async", staleness=staleness)
    callbacks = [tfdist.callbacks.StalenessMonitor(),
                 Straggler(strategy.rank == args.straggler), Die(strategy.rank == args.die)]
    if args.staleness_aware:
        callbacks.append(tfdist.callbacks.StalenessAwareLearningRate())
    if args.announce:
        callbacks.append(Announce(strategy.rank))
    if args.job == "momentum":
        result = momentum(strategy, callbacks, args.backup)
    else:
        result = (constant if args.job == "constant" else real)(strategy, callbacks)
    result["rank"] = strategy.rank
    aggregator = strategy.extended.aggregator  # one worker and no server: nothing to ask
    result["server_stats"] = (aggregator.server_stats() if isinstance(
        aggregator, tfdist.aggregation.ParameterServerAggregator) else [])
    with open(f"{args.out}.rank{strategy.rank}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
