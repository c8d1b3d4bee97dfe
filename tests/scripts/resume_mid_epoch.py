"""Worker script: a shuffled fit backed up every 5 steps, stopped mid-epoch and resumed.

    python resume_mid_epoch.py OUT BACKUP_DIR [--strategy plain|ring|sharded|tree|ps|async]
        [--backend auto|horovod] [--input numpy|tfdata|tfdata-unseeded|pydataset] [--dropout]
        [--stop-at-step S] [--announce [--pause-after STEP:SECONDS]] [--backup-per-rank]

or `train(...)` on each simulated rank (test_resume_in_process.py).

A keras.io-style classifier (two Dense layers, optionally a Dropout) on
synthetic data: Adam with a CosineDecay schedule, sparse categorical
accuracy, `EarlyStopping(monitor="loss", patience=2, min_delta=1.0)` (every
epoch after the first counts against its patience, so it stops training
after the third epoch, only if its state survives a resume) and the user's
`keras.callbacks.BackupAndRestore(BACKUP_DIR, save_freq=5)`. 12 steps per
epoch of a global batch of 32 (the last batch 8 rows: some ranks' slices
are empty), shuffled each epoch: NumPy arrays (`shuffle=True`), or a
`tf.data` pipeline reshuffled each iteration with a seed (or with
TensorFlow's global seed only), or a `PyDataset` that reshuffles its rows
with its own generator after every epoch. `--stop-at-step S` raises on every rank
once the optimizer has taken S steps (a kill, as far as the backup
knows); `notice_at_step` gives a rank the preemption notice after step S; `--announce` prints "rank R pid P step S" after each step (so a
test can kill a process mid-epoch). Every rank writes OUT.rank<R>.npz:
the final weights and the history of this run.
"""

import argparse
import contextlib
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402

ROWS, BATCH, EPOCHS, SAVE_FREQ = 360, 32, 6, 5

STRATEGIES = {
    "plain": lambda: None,
    "ring": tfdist.strategies.RingAllReduceStrategy,
    "sharded": lambda: tfdist.strategies.RingAllReduceStrategy(shard_optimizer_state=True),
    "parameters": lambda: tfdist.strategies.RingAllReduceStrategy(sharding="parameters"),
    "tree": lambda: tfdist.strategies.ReductionTreeStrategy(fanout=2),
    "ps": tfdist.strategies.ParameterServerStrategy,
    "async": lambda: tfdist.strategies.ParameterServerStrategy(mode="async"),
}


class Stopped(Exception):
    """Raised on every rank at the step a test stops the run (as a kill would)."""


class NoticeAtStep(keras.callbacks.Callback):
    """Gives this rank the preemption notice after optimizer step `step` (as a SIGTERM's
    handler would; for simulated ranks, which share one process's signals), twice; or,
    `before_step`, as step `step` + 1 begins, after its flags were written (as a signal
    arriving while the step's all-reduce runs)."""

    def __init__(self, strategy, step, before_step=False):
        super().__init__()
        self.strategy, self.step, self.before_step = strategy, step, before_step

    def _notice_at(self, hook_is_before):
        if (hook_is_before == self.before_step
                and int(self.model.optimizer.iterations.numpy()) == self.step):
            for _ in range(2):  # a second notice changes nothing
                self.strategy.extended.preemption.notice("a test's notice")

    def on_train_batch_begin(self, batch, logs=None):
        self._notice_at(True)

    def on_train_batch_end(self, batch, logs=None):
        self._notice_at(False)


class StopAtStep(keras.callbacks.Callback):
    def __init__(self, step, announce_as=None, pause=(None, 0.0)):
        super().__init__()
        self.step, self.announce_as, self.pause = step, announce_as, pause

    def on_train_batch_end(self, batch, logs=None):
        taken = int(self.model.optimizer.iterations.numpy())
        if self.announce_as is not None:
            print(f"rank {self.announce_as} pid {os.getpid()} step {taken}", flush=True)
            if taken == self.pause[0]:  # time for a test to signal a process mid-epoch
                time.sleep(self.pause[1])
        if self.step is not None and taken >= self.step:
            raise Stopped(f"stopped at step {taken}")


class ShuffledBatches(keras.utils.PyDataset):
    """The rows in an order the dataset's own generator draws anew after every epoch."""

    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y
        self.rng = np.random.default_rng(3)
        self.order = self.rng.permutation(len(x))

    def __len__(self):
        return -(-len(self.x) // BATCH)

    def __getitem__(self, index):
        rows = self.order[index * BATCH:(index + 1) * BATCH]
        return self.x[rows], self.y[rows]

    def on_epoch_end(self):
        self.order = self.rng.permutation(len(self.x))


def data(kind):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 8)).astype("float32")
    y = (np.argmax(x[:, :3] + 0.3 * rng.normal(size=(ROWS, 3)), axis=1)).astype("int32")
    if kind == "numpy":
        return {"x": x, "y": y, "batch_size": BATCH, "shuffle": True}
    if kind == "pydataset":
        return {"x": ShuffledBatches(x, y), "shuffle": False}
    seed = None if kind == "tfdata-unseeded" else 7
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(ROWS, seed=seed).batch(BATCH)
    return {"x": dataset}


def train(out, backup_dir, strategy_name="ring", inputs="numpy", dropout=False,
          stop_at_step=None, announce=False, backup_per_rank=False, save_freq=SAVE_FREQ,
          notice_at_step=None, pause=(None, 0.0), double_checkpoint=False,
          notice_before_step=False, restore_best_weights=False):
    """Train (resuming from BACKUP_DIR's backup if there is one); write OUT.rank<R>.npz."""
    strategy = STRATEGIES[strategy_name]()
    rank = strategy.rank if strategy is not None else 0
    if backup_per_rank:  # only the chief's directory gets files, as without a shared filesystem
        backup_dir = os.path.join(backup_dir, f"rank{rank}")
    keras.utils.set_random_seed(11)
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        layers = [keras.Input((8,)), keras.layers.Dense(32, activation="relu")]
        layers += [keras.layers.Dropout(0.3)] if dropout else []
        model = keras.Sequential(layers + [keras.layers.Dense(3)])
        schedule = keras.optimizers.schedules.CosineDecay(3e-2, decay_steps=EPOCHS * 12)
        model.compile(optimizer=keras.optimizers.Adam(schedule),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["sparse_categorical_accuracy"])
    callbacks = [keras.callbacks.EarlyStopping(monitor="loss", patience=2, min_delta=1.0,
                                               restore_best_weights=restore_best_weights),
                 keras.callbacks.BackupAndRestore(backup_dir, save_freq=save_freq,
                                                  double_checkpoint=double_checkpoint)]
    if stop_at_step is not None or announce:
        callbacks.append(StopAtStep(stop_at_step, rank if announce else None, pause))
    if notice_at_step is not None:
        callbacks.append(NoticeAtStep(strategy, notice_at_step, notice_before_step))
    try:
        history = model.fit(**data(inputs), epochs=EPOCHS, verbose=0, callbacks=callbacks)
    except Stopped as stop:
        print(f"rank {rank} {stop}", flush=True)
        return None
    result = {f"w{i}": w for i, w in enumerate(model.get_weights())}
    result.update({f"history/{key}": np.asarray(values)
                   for key, values in history.history.items()})
    result["epochs"] = np.asarray(history.epoch)
    result["steps"] = np.asarray(int(model.optimizer.iterations.numpy()))
    np.savez(f"{out}.rank{rank}.npz", **result)
    print(f"rank {rank} finished", flush=True)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("backup_dir")
    parser.add_argument("--strategy", choices=sorted(STRATEGIES), default="ring")
    parser.add_argument("--input", choices=["numpy", "tfdata", "tfdata-unseeded", "pydataset"],
                        default="numpy")
    parser.add_argument("--dropout", action="store_true")
    parser.add_argument("--stop-at-step", type=int)
    parser.add_argument("--announce", action="store_true")
    parser.add_argument("--backend", default="auto", help="the ring's engine")
    parser.add_argument("--pause-after", default=None, metavar="STEP:SECONDS",
                        help="with --announce, sleep SECONDS after step STEP (a launcher that "
                             "relays output late)")
    parser.add_argument("--backup-per-rank", action="store_true",
                        help="back up under BACKUP_DIR/rank<R> (only the chief's has files)")
    args = parser.parse_args(argv)
    STRATEGIES["ring"] = lambda: tfdist.strategies.RingAllReduceStrategy(backend=args.backend)
    step, _, seconds = (args.pause_after or ":0").partition(":")
    train(args.out, args.backup_dir, args.strategy, args.input, args.dropout,
          args.stop_at_step, args.announce, args.backup_per_rank,
          pause=(int(step) if step else None, float(seconds)))


if __name__ == "__main__":
    main()
