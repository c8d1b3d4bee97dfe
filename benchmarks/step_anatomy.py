"""Per-step anatomy worker (run under tfdist-run or horovodrun; rank 0 writes JSON).

Usage: step_anatomy.py OUT.json STRATEGY [BACKEND] [--user-callback] [--batch N]

Trains the digits demo model (global batch 64, 4 epochs) and counts, per
training step: the communications inside the compiled step (tfdist's
communication counters: every all-reduce, gather, push or pull), the eager
exchanges between steps (the stop-flag all-reduce Keras' loop triggers),
the Python callbacks Keras calls around every step (batch hooks that are not
the base class's no-ops), and the time: wall time per step (epochs 2-4,
epoch boundaries included), the median step (Keras' batch begin to batch
end: one call of the train function) and the counters' communication time
and share. The per-step fixed cost of
distribution, in numbers (issue: cut it). `--user-callback` adds the
callback most scripts carry, a user's own epoch-end logger (not marked as
agreeing across ranks, so it may stop training on one rank alone): its stop
flag is agreed at epoch ends only, never per batch. `--batch N` trains at
global batch N (the benchmark's control: two independent single processes at
half the batch each, what a step with free communication would cost).
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from tfdist.strategies.keras_surface import model_strategy  # noqa: E402
from tfdist.profiling.report import CommunicationReport  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from digits import build_model, load_data  # noqa: E402  (the bundled demo's data and model)

EPOCHS = 4
BATCH = 64
BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end")


@model_strategy.agrees_across_ranks  # it never sets a stop flag
class Anatomy(keras.callbacks.Callback):
    """Counts and times the steps of epochs 2.. (the first one compiles)."""

    def __init__(self, strategy):
        super().__init__()
        self.strategy = strategy
        self.report = CommunicationReport(strategy) if strategy.world_size > 1 else None
        self.exchanges = 0
        self.steps, self.start, self.result = 0, None, {}
        self.step_seconds, self.step_start = [], None
        extended = strategy.extended
        any_rank = extended.any_rank

        def counted(flag, training=False):
            self.exchanges += int(self.start is not None and training)
            return any_rank(flag, training=training)

        extended.any_rank = counted  # called only when the exchange is made

    def on_train_begin(self, logs=None):
        if self.report is not None:
            self.report.start(self.model)

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            if self.report is not None:
                self.report.take()
            self.start = time.perf_counter()

    def on_train_batch_begin(self, batch, logs=None):
        self.step_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self.start is not None:
            self.steps += 1
            self.step_seconds.append(time.perf_counter() - self.step_start)

    def on_train_end(self, logs=None):
        seconds = time.perf_counter() - self.start
        communication = self.report.take() if self.report is not None else {}
        counters = (self.strategy.extended.communication_counters.snapshot()
                    if self.report is not None else None)
        self.result = {"ms_per_step": 1e3 * seconds / self.steps, "steps": self.steps,
                       "median_step_ms": 1e3 * statistics.median(self.step_seconds),
                       "eager_exchanges_per_step": self.exchanges / self.steps,
                       "communication": communication,
                       "in_step_communications_per_step": (counters.calls / counters.steps
                                                           if counters else 0)}


class EpochLogger(keras.callbacks.Callback):
    """A user's epoch-level callback: keeps the epoch's logs (what a W&B/MLflow logger does)."""

    def __init__(self):
        super().__init__()
        self.history = []

    def on_epoch_end(self, epoch, logs=None):
        self.history.append(dict(logs or {}))


def batch_callbacks(callback_list):
    """Names of the callbacks whose batch hooks do something (not keras.callbacks.Callback's)."""
    names = []
    for callback in callback_list.callbacks:
        if any(getattr(type(callback), hook) is not getattr(keras.callbacks.Callback, hook)
               for hook in BATCH_HOOKS):
            names.append(type(callback).__name__)
    return names


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("strategy", choices=["ring", "tree", "ps"])
    parser.add_argument("backend", nargs="?", default="collective")
    parser.add_argument("--user-callback", action="store_true")
    parser.add_argument("--batch", type=int, default=BATCH)
    args = parser.parse_args()
    out, name, backend = args.out, args.strategy, args.backend
    user_callback, batch = args.user_callback, args.batch
    keras.utils.set_random_seed(0)
    strategy = {"ring": lambda: tfdist.strategies.RingAllReduceStrategy(backend=backend),
                "tree": tfdist.strategies.ReductionTreeStrategy,
                "ps": tfdist.strategies.ParameterServerStrategy}[name]()
    (x, y), _ = load_data()
    with strategy.scope():
        model = build_model()
        model.compile(optimizer=keras.optimizers.Adam(2e-3), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    anatomy = Anatomy(strategy)
    seen = {}
    original = keras.callbacks.CallbackList.on_train_begin

    def remember(callback_list, logs=None):
        seen["callbacks"] = batch_callbacks(callback_list)
        return original(callback_list, logs)

    keras.callbacks.CallbackList.on_train_begin = remember
    callbacks = [anatomy] + ([EpochLogger()] if user_callback else [])
    model.fit(x, y, batch_size=batch, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    # The counters calls include the first all-reduce of the step; the Anatomy callback
    # itself is the measurement, not part of what a user's fit calls.
    callbacks = [c for c in seen["callbacks"] if c != "Anatomy"]
    if strategy.is_chief:
        result = {"strategy": name, "backend": backend if name == "ring" else "collective",
                  "user_callback": user_callback, "global_batch": batch,
                  "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
                  "processes": strategy.world_size, **anatomy.result,
                  "batch_callbacks_per_step": callbacks}
        with open(out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
