"""Worker script for the kill matrix: announces each phase so a test can SIGKILL a process in it.

    python kill_target.py WORKDIR [--strategy ring|ps|ps-async|tree|plain]
                                  [--backend auto|horovod] [--step-delay SECONDS] [--backup]

Every process prints "tfdist-kill <who> pid <pid> phase <phase>" (who: "rank R"
or "server K") as it reaches a phase:

  start      before the strategy is created (servers: then they serve)
  train      as epoch 1 of `fit` starts (steps take --step-delay, 0.05 s, more)
  evaluate   as `evaluate` after `fit` starts (steps take --step-delay more)
  save       as the chief starts writing WORKDIR/ckpt.keras (ModelCheckpoint, each epoch)

then "rank R finished". The model has ~1.1 M parameters, so a checkpoint takes a
noticeable time to write.

--backup (the kill matrix's restart column): seeded, a shuffled fit with
`BackupAndRestore(WORKDIR/backup, save_freq=3)`, and every rank writes its
final weights to WORKDIR/weights.rank<R>.npz (`--strategy plain`: the script
without tfdist, the reference).
"""

import argparse
import contextlib
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402
from tfdist import runtime  # noqa: E402


def announce(who, phase):
    print(f"tfdist-kill {who} pid {os.getpid()} phase {phase}", flush=True)


class Phases(keras.callbacks.Callback):
    """Announces the train/evaluate/save phases; placed before ModelCheckpoint."""

    def __init__(self, who, is_chief, step_delay):
        super().__init__()
        self.who, self.is_chief, self.step_delay = who, is_chief, step_delay
        self.fitting = True

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            announce(self.who, "train")

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.step_delay)

    def on_epoch_end(self, epoch, logs=None):
        if self.is_chief:
            announce(self.who, "save")  # ModelCheckpoint writes right after this callback

    def on_test_begin(self, logs=None):
        if not self.fitting:  # `evaluate`, not fit's validation
            announce(self.who, "evaluate")

    def on_test_batch_end(self, batch, logs=None):
        time.sleep(self.step_delay)


STRATEGIES = {
    "ring": lambda args: tfdist.strategies.RingAllReduceStrategy(backend=args.backend),
    "tree": lambda args: tfdist.strategies.ReductionTreeStrategy(fanout=2),
    "ps": lambda args: tfdist.strategies.ParameterServerStrategy(),
    "ps-async": lambda args: tfdist.strategies.ParameterServerStrategy(mode="async",
                                                                       staleness=2),
    "plain": lambda args: None,
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir")
    parser.add_argument("--strategy", choices=sorted(STRATEGIES), default="ring")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--step-delay", type=float, default=0.05,
                        help="seconds added to each step (longer where output arrives late)")
    parser.add_argument("--backup", action="store_true",
                        help="back up every 3 steps and write the final weights")
    args = parser.parse_args()
    cluster = runtime.cluster()
    who = f"server {cluster.server_index}" if cluster.is_server else f"rank {cluster.rank}"
    announce(who, "start")
    strategy = STRATEGIES[args.strategy](args)
    rank, is_chief = (strategy.rank, strategy.is_chief) if strategy is not None else (0, True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 64)).astype("float32")
    y = x[:, :1] * 2.0
    if args.backup:
        keras.utils.set_random_seed(5)
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(1024, activation="relu"),
                                  keras.layers.Dense(1024, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    phases = Phases(who, is_chief, args.step_delay)
    backup = ([keras.callbacks.BackupAndRestore(os.path.join(args.workdir, "backup"),
                                                save_freq=3)] if args.backup else [])
    model.fit(x, y, batch_size=64, epochs=3, verbose=0, callbacks=[
        phases, keras.callbacks.ModelCheckpoint(os.path.join(args.workdir, "ckpt.keras"))]
        + backup)
    phases.fitting = False
    model.evaluate(x, y, batch_size=64, verbose=0, callbacks=[phases])
    if args.backup:
        np.savez(os.path.join(args.workdir, f"weights.rank{rank}.npz"), *model.get_weights())
    print(f"{who} finished", flush=True)


if __name__ == "__main__":
    main()
