"""Worker script for failure tests: each mode breaks the job in one way.

  train            train normally (used with a missing peer or a busy port)
  crash RANK       rank RANK dies (os._exit(3)) in the middle of epoch 2
  mismatch         rank 1 builds a wider layer than rank 0
  uneven           rank 1 passes less data than rank 0
  own_shard        each rank passes only its own shard, x[rank::world] (Horovod's habit)
  stall            rank 1 stays alive but stops taking part (sleeps) in epoch 2
  slow             train with 0.1 s pauses per batch (about 10 s), printing each epoch
  late_exit        train normally; rank 1 then takes 8 s more than rank 0 to exit
  refusals         in one job, each input every rank must refuse alike, caught and printed
                   ("refused CASE: MESSAGE"), then "finished": uneven and own_shard as above,
                   batch_size (rank 1 passes 26 where rank 0 passes 24, the same batches),
                   counter (an int32 layer counter of rows declared without aggregation,
                   batches of 25 split 13/12)
Add --strategy tree (fanout 2) or --strategy ps to train with that strategy instead of the ring.
"""

import argparse
import atexit
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402


class CrashAt(keras.callbacks.Callback):
    def __init__(self, rank, strategy, stall=False):
        super().__init__()
        self.rank, self.strategy, self.stall = rank, strategy, stall

    def on_train_batch_begin(self, batch, logs=None):
        if self.strategy.rank == self.rank and batch == 3 and self.epoch == 1:
            if self.stall:
                print("stalling on purpose", flush=True)
                time.sleep(600)
            print("crashing on purpose", flush=True)
            os._exit(3)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch


class Slowly(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        print(f"epoch {epoch} started", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.1)


STRATEGIES = {
    "ring": tfdist.strategies.RingAllReduceStrategy,
    "tree": lambda: tfdist.strategies.ReductionTreeStrategy(fanout=2),
    "ps": tfdist.strategies.ParameterServerStrategy,
}


class RowCounter(keras.layers.Layer):
    """Counts the rows it sees in an int32 variable that declares no aggregation."""

    def build(self, input_shape):
        self.rows = self.add_weight(shape=(), initializer="zeros", dtype="int32",
                                    trainable=False, name="rows_seen")

    def call(self, inputs, training=None):
        if training:
            self.rows.assign_add(keras.ops.shape(inputs)[0])
        return inputs


def refusals(strategy, say=None):
    """Every case must fail alike on every rank (so the job goes on to the next). `say`:
    where each line goes (default: printed; simulated ranks collect their own)."""
    say = say or (lambda line: print(line, flush=True))
    for case in ("uneven", "own_shard", "batch_size", "counter"):
        rng = np.random.default_rng(0)  # the same rows on every rank, case after case
        with strategy.scope():
            layers = [RowCounter()] if case == "counter" else []
            model = keras.Sequential([keras.Input((4,))] + layers + [keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
        n = 432 if case == "uneven" and strategy.rank == 1 else 480
        x = rng.normal(size=(n, 4)).astype("float32")
        y = x.sum(axis=1, keepdims=True)
        if case == "own_shard":
            x, y = x[strategy.rank::strategy.world_size], y[strategy.rank::strategy.world_size]
        batch_size = 26 if case == "batch_size" and strategy.rank == 1 else 24
        if case == "counter":
            batch_size = 25  # slices of 13 and 12 rows: the ranks' counts part at once
        try:
            model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0)
        except (ValueError, tf.errors.InvalidArgumentError) as error:
            message = " ".join(str(error).split())
            message = message[max(0, message.find("assertion failed")):]  # past the traceback
            say(f"refused {case}: {message[:600]}")
        else:
            say(f"accepted {case}")
    say("finished")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode")
    parser.add_argument("rank", nargs="?", type=int, default=1)
    parser.add_argument("--strategy", choices=sorted(STRATEGIES), default="ring")
    parser.add_argument("--tag", default="", help="ignored: lets a test find its processes")
    args = parser.parse_args()
    mode = args.mode
    strategy = STRATEGIES[args.strategy]()
    if mode == "refusals":
        refusals(strategy)
        return
    width = 8 + (4 if mode == "mismatch" and strategy.rank == 1 else 0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(width),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    n = 432 if mode == "uneven" and strategy.rank == 1 else 480
    x = np.random.default_rng(0).normal(size=(n, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    if mode == "own_shard":
        x, y = x[strategy.rank::strategy.world_size], y[strategy.rank::strategy.world_size]
    callbacks = []
    if mode == "crash":
        callbacks = [CrashAt(args.rank, strategy)]
    elif mode == "stall":
        callbacks = [CrashAt(1, strategy, stall=True)]
    elif mode == "slow":
        callbacks = [Slowly()]
    model.fit(x, y, batch_size=24, epochs=3, verbose=0, callbacks=callbacks)
    print("finished", flush=True)
    if mode == "late_exit" and strategy.rank == 1:
        atexit.register(time.sleep, 8)  # runs before tfdist's own exit handlers


if __name__ == "__main__":
    main()
