"""Worker script for failure tests: each mode breaks the job in one way.

  train            train normally (used with a missing peer or a busy port)
  crash RANK       rank RANK dies (os._exit(3)) in the middle of epoch 2
  mismatch         rank 1 builds a wider layer than rank 0
  uneven           rank 1 passes less data than rank 0
  own_shard        each rank passes only its own shard, x[rank::world] (Horovod's habit)
  stall            rank 1 stays alive but stops taking part (sleeps) in epoch 2
  slow             train with 0.1 s pauses per batch (about 10 s), printing each epoch
  late_exit        train normally; rank 1 then takes 8 s more than rank 0 to exit
Add --strategy tree (fanout 2) or --strategy ps to train with that strategy instead of the ring.
"""

import argparse
import atexit
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode")
    parser.add_argument("rank", nargs="?", type=int, default=1)
    parser.add_argument("--strategy", choices=sorted(STRATEGIES), default="ring")
    parser.add_argument("--tag", default="", help="ignored: lets a test find its processes")
    args = parser.parse_args()
    mode = args.mode
    strategy = STRATEGIES[args.strategy]()
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
