"""Worker script for the resume tests: a job that backs up every epoch and can be rerun.

    python resume_job.py OUT BACKUP_DIR [--strategy ring|tree|ps] [--backend auto|horovod]
                         [--no-shared-filesystem]

Trains a small model with Adam for 5 epochs of 8 steps under
`keras.callbacks.BackupAndRestore(BACKUP_DIR)`, 0.05 s per step, printing
"rank R pid P epoch E" as each epoch starts (so a test can kill a process
mid-epoch). Rerunning the same command after a kill resumes from the last
completed epoch. Every rank writes OUT.rank<R>.npz: final weights, the
epochs this run trained, and their losses.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402

STRATEGIES = {
    "ring": lambda args: tfdist.strategies.RingAllReduceStrategy(backend=args.backend),
    "tree": lambda args: tfdist.strategies.ReductionTreeStrategy(fanout=2),
    "ps": lambda args: tfdist.strategies.ParameterServerStrategy(),
}
EPOCHS = 5


class Announce(keras.callbacks.Callback):
    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def on_epoch_begin(self, epoch, logs=None):
        print(f"rank {self.rank} pid {os.getpid()} epoch {epoch}", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.05)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("backup_dir")
    parser.add_argument("--strategy", choices=sorted(STRATEGIES), default="ring")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--no-shared-filesystem", action="store_true",
                        help="each rank backs up under BACKUP_DIR/rank<R>, so only the chief's "
                             "directory has files (as on machines without a shared filesystem)")
    args = parser.parse_args()
    strategy = STRATEGIES[args.strategy](args)
    keras.utils.set_random_seed(5)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 10)).astype("float32")
    y = (np.tanh(x @ rng.normal(size=(10, 2)))).astype("float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    backup_dir = args.backup_dir
    if args.no_shared_filesystem:
        backup_dir = os.path.join(backup_dir, f"rank{strategy.rank}")
    history = model.fit(x, y, batch_size=32, epochs=EPOCHS, shuffle=False, verbose=0,
                        callbacks=[keras.callbacks.BackupAndRestore(backup_dir),
                                   Announce(strategy.rank)])
    np.savez(f"{args.out}.rank{strategy.rank}.npz", *model.get_weights(),
             epochs_run=np.array(len(history.history["loss"])),
             losses=np.array(history.history["loss"]))
    print(f"rank {strategy.rank} finished", flush=True)


if __name__ == "__main__":
    main()
