"""Profiling overhead worker (run under tfdist-run; rank 0 writes JSON): the digits job's step time.

Usage: profiling_overhead.py OUT.json MODE LOG_DIR
MODE: "none" (no TensorBoard), "epoch" (keras.callbacks.TensorBoard with
update_freq="epoch") or "batch" (update_freq=1: tfdist reads its counters
and writes its scalars after every step - the worst case). The steady-state
time per step is the wall time of epochs 2..EPOCHS (every callback
included) divided by their steps. Run from any checkout: the benchmark
compares this commit with the one before profiling existed. With this
checkout, also the host time tfdist's TensorBoard scalars take (reading the
counters, writing the summaries), per step.
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

import tfdist  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from digits import build_model, load_data  # noqa: E402  (the bundled demo's data and model)

EPOCHS = 5
BATCH = 64


class EpochClock(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seconds, self.steps, self.start = [], [], None

    def on_epoch_begin(self, epoch, logs=None):
        self.start, self.count = time.perf_counter(), 0
        if epoch == 1:
            self.host_at_epoch_1 = self.host.seconds

    @property
    def host_seconds(self):
        return self.host.seconds - self.host_at_epoch_1

    def on_train_batch_end(self, batch, logs=None):
        self.count += 1

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self.start)
        self.steps.append(self.count)


class HostTime:
    """Seconds spent in tfdist's TensorBoard scalars callback (absent before profiling existed)."""

    def __init__(self):
        self.seconds = 0.0
        try:
            from tfdist.profiling.report import TensorBoardScalars
        except ImportError:
            return
        write = TensorBoardScalars._write  # pylint: disable=protected-access

        def timed_write(callback, step):
            start = time.perf_counter()
            write(callback, step)
            self.seconds += time.perf_counter() - start

        TensorBoardScalars._write = timed_write  # pylint: disable=protected-access


def main():
    out, mode, log_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    host = HostTime()
    keras.utils.set_random_seed(0)
    strategy = tfdist.strategies.RingAllReduceStrategy(backend="collective")
    (x, y), _ = load_data()
    with strategy.scope():
        model = build_model()
        model.compile(optimizer=keras.optimizers.Adam(2e-3), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    clock = EpochClock()
    clock.host = host
    callbacks = [clock]
    if mode != "none":
        callbacks.insert(0, keras.callbacks.TensorBoard(
            log_dir, update_freq="epoch" if mode == "epoch" else 1))
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    if strategy.is_chief:
        result = {"mode": mode, "processes": strategy.world_size,
                  "ms_per_step": 1e3 * sum(clock.seconds[1:]) / sum(clock.steps[1:]),
                  "steps_timed": sum(clock.steps[1:]),
                  "scalars_host_ms_per_step": 1e3 * clock.host_seconds / sum(clock.steps[1:])}
        with open(out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
