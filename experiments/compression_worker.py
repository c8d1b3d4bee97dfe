"""Compression-training worker: one (model, compressor) cell trained with Keras' fit.

Usage (one process per rank: under `tfdist-run -np P`, or with a TF_CONFIG
per host of the emulated cluster):

    compression_worker.py OUT.json MODEL COMPRESSOR

MODEL is a name of `MODELS`, COMPRESSOR a name of `COMPRESSORS`. The model
is trained under `RingAllReduceStrategy(backend="collective",
compression=...)` with a fixed seed, the model's fixed global batch and
number of epochs, SGD with momentum 0.9 and a cosine-decayed learning rate
(the same for every compressor: chosen so that the uncompressed run
converges), one intra-op thread per process. After every epoch the
held-out set is evaluated (through the strategy, in `fit`'s validation).

Rank 0 writes OUT.json (a process that fails writes its traceback to
OUT.json.error.<pid>):
  * per epoch: `seconds` - training seconds since the end of the first step
    (the first step's tracing and compilation left out, validation passes
    left out), `val_accuracy`, `loss`, `sent_mb_per_step` (this rank's bytes
    on the wire per step: `tfdist.callbacks.CommunicationMonitor`),
    `comm_ms`, `step_ms`;
  * `cpu_busy_share`: the busy share of all the machine's CPUs from the end of
    the first step to the end of fit (/proc/stat: every process on it);
  * `first_step_seconds`, `median_step_ms` (steps after the first epoch),
    `final_val_accuracy` (after the last epoch) and the run's settings.

Models (at P = 4 on loopback, on 2 cores: about 20 s of training for digits,
60-85 s for text):
  * `digits`: the CNN of examples/digits.py on scikit-learn's 8x8 digits
    (1,438 training, 359 held-out images; 151 k parameters, 0.59 MB of
    float32 gradients per step, all dense);
  * `text`: a synthetic sequence classification - 32 tokens from a
    vocabulary of 2,000, 8 classes, each class with a keyword set (every
    keyword in two classes' sets), 4 keywords of the sequence's class at
    random positions among uniform noise tokens (4,000 training, 1,000
    held-out sequences). Model: Embedding(2000, 64) -> Conv1D(256, 3) ->
    global max pooling -> Dense(512) -> Dense(8): 128 k embedding
    parameters whose gradient stays sparse (tfdist all-gathers its rows,
    uncompressed) and 185 k dense parameters (0.74 MB) that the compressor
    gets. Max pooling cannot count keywords, so accuracy saturates below
    100% (about 86%).
"""

import json
import os
import sys
import time

# TensorFlow, Keras and tfdist are imported in the functions that use them: the driver
# (`experiments.compression_training`) imports the tables below without starting TensorFlow.

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 0
MOMENTUM = 0.9


def _compression():
    import tfdist.compression  # pylint: disable=import-outside-toplevel

    return tfdist.compression


# Name -> the strategy's `compression` argument (built lazily, in the worker only).
COMPRESSORS = {
    "fp32": lambda: None,
    "fp16": lambda: _compression().FP16(),
    "powersgd_r1": lambda: _compression().PowerSGD(rank=1),
    "powersgd_r2": lambda: _compression().PowerSGD(rank=2),
    "powersgd_r4": lambda: _compression().PowerSGD(rank=4),
    "topk_1%": lambda: _compression().TopK(ratio=0.01),
    "topk_0.1%": lambda: _compression().TopK(ratio=0.001),
    "signsgd": lambda: _compression().SignSGD(),
}


def digits_data():
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
    import digits  # pylint: disable=import-outside-toplevel

    return digits.load_data(seed=SEED), digits.build_model


TEXT_VOCABULARY, TEXT_LENGTH, TEXT_CLASSES = 2000, 32, 8
TEXT_KEYWORDS_PER_CLASS, TEXT_CLASSES_PER_KEYWORD, TEXT_HITS = 40, 2, 4
TEXT_TRAIN, TEXT_HELD_OUT = 4000, 1000


def text_data():
    """Synthetic keyword classification (module docstring); the same on every rank."""
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(SEED)
    num_keywords = TEXT_CLASSES * TEXT_KEYWORDS_PER_CLASS // TEXT_CLASSES_PER_KEYWORD
    keywords = rng.permutation(np.arange(1, TEXT_VOCABULARY))[:num_keywords]
    members = [[] for _ in range(TEXT_CLASSES)]
    for keyword in keywords:
        for c in rng.choice(TEXT_CLASSES, TEXT_CLASSES_PER_KEYWORD, replace=False):
            members[c].append(keyword)
    n = TEXT_TRAIN + TEXT_HELD_OUT
    x = rng.integers(1, TEXT_VOCABULARY, size=(n, TEXT_LENGTH))
    y = rng.integers(0, TEXT_CLASSES, size=n)
    for i in range(n):
        positions = rng.choice(TEXT_LENGTH, TEXT_HITS, replace=False)
        x[i, positions] = rng.choice(members[y[i]], TEXT_HITS, replace=False)
    x, y = x.astype("int32"), y.astype("int32")
    data = ((x[:TEXT_TRAIN], y[:TEXT_TRAIN]), (x[TEXT_TRAIN:], y[TEXT_TRAIN:]))

    def build_model():
        return keras.Sequential([
            keras.Input((TEXT_LENGTH,), dtype="int32"),
            keras.layers.Embedding(TEXT_VOCABULARY, 64),
            keras.layers.Conv1D(256, 3, activation="relu"),
            keras.layers.GlobalMaxPooling1D(),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(TEXT_CLASSES, activation="softmax"),
        ])

    return data, build_model


# Name -> (data and model builder, global batch, epochs, peak learning rate).
MODELS = {
    "digits": (digits_data, 64, 15, 0.05),
    "text": (text_data, 64, 12, 0.15),
}


def cpu_times():
    """(total, idle) jiffies of all this machine's CPUs (/proc/stat), or None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(fields), fields[3] + fields[4]  # idle + iowait


def busy_share(before, after):
    """Share of the machine's CPU time that was busy between two `cpu_times()`."""
    if before is None or after is None or after[0] == before[0]:
        return None
    return 1.0 - (after[1] - before[1]) / (after[0] - before[0])


def _epoch_recorder():
    import keras  # pylint: disable=import-outside-toplevel

    from tfdist.callbacks import agrees_across_ranks  # pylint: disable=import-outside-toplevel

    @agrees_across_ranks  # it never stops training: no stop-flag exchange per batch
    class EpochRecorder(keras.callbacks.Callback):
        """Training seconds (no first step, no validation), accuracy and bytes per epoch."""

        def __init__(self):
            super().__init__()
            self.epochs, self.step_seconds = [], []
            self.clock = 0.0  # training seconds counted so far
            self.first_step_seconds = None
            self._since = self._step_start = None
            self._epoch = 0
            self._cpu_start = None
            self.cpu_busy = None

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = epoch
            self._since = time.perf_counter()

        def on_train_batch_begin(self, batch, logs=None):
            self._step_start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if self.first_step_seconds is None:
                self.first_step_seconds = now - self._step_start
                self._since = now  # the clock starts after the first step
                self._cpu_start = cpu_times()
            elif self._epoch > 0:
                self.step_seconds.append(now - self._step_start)

        def on_test_begin(self, logs=None):
            if self._since is not None:  # validation inside fit: stop the clock
                self.clock += time.perf_counter() - self._since
                self._since = None

        def on_epoch_end(self, epoch, logs=None):
            if self._since is not None:
                self.clock += time.perf_counter() - self._since
                self._since = None
            logs = logs or {}
            self.epochs.append({
                "epoch": epoch + 1, "seconds": self.clock,
                "val_accuracy": float(logs.get("val_accuracy", float("nan"))),
                "loss": float(logs.get("loss", float("nan"))),
                "sent_mb_per_step": float(logs.get("sent_mb", 0.0)),
                "comm_ms": float(logs.get("comm_ms", 0.0)),
                "step_ms": float(logs.get("step_ms", 0.0)),
            })

        def on_train_end(self, logs=None):
            self.cpu_busy = busy_share(self._cpu_start, cpu_times())

    return EpochRecorder()


def main():
    out, model_name, compressor_name = sys.argv[1:4]
    if model_name not in MODELS or compressor_name not in COMPRESSORS:
        raise SystemExit(f"usage: compression_worker.py OUT.json {{{','.join(MODELS)}}} "
                         f"{{{','.join(COMPRESSORS)}}}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    tf.config.threading.set_intra_op_parallelism_threads(1)  # up to 8 processes, few cores
    import keras  # pylint: disable=import-outside-toplevel

    import tfdist  # pylint: disable=import-outside-toplevel

    load, global_batch, epochs, learning_rate = MODELS[model_name]
    compression = COMPRESSORS[compressor_name]()
    strategy = tfdist.strategies.RingAllReduceStrategy(backend="collective",
                                                       compression=compression)
    keras.utils.set_random_seed(SEED)
    ((x, y), (x_val, y_val)), build_model = load()
    steps = epochs * -(-len(x) // global_batch)
    with strategy.scope():
        model = build_model()
        schedule = keras.optimizers.schedules.CosineDecay(learning_rate, steps)
        model.compile(optimizer=keras.optimizers.SGD(schedule, momentum=MOMENTUM),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    recorder = _epoch_recorder()
    start = time.perf_counter()
    model.fit(x, y, batch_size=global_batch, epochs=epochs, validation_data=(x_val, y_val),
              verbose=0, callbacks=[tfdist.callbacks.CommunicationMonitor(), recorder])
    wall = time.perf_counter() - start
    if not strategy.is_chief:
        return
    step_ms = sorted(1000 * s for s in recorder.step_seconds)
    result = {
        "model": model_name, "compressor": compressor_name, "compression": repr(compression),
        "processes": strategy.world_size, "launcher": strategy.cluster.launcher,
        "global_batch": global_batch, "epochs": epochs, "steps": steps,
        "learning_rate": learning_rate, "momentum": MOMENTUM,
        "parameters": int(model.count_params()),
        "first_step_seconds": recorder.first_step_seconds,
        "fit_wall_seconds": wall,
        "train_seconds": recorder.clock,
        "cpu_busy_share": recorder.cpu_busy,
        "median_step_ms": step_ms[len(step_ms) // 2] if step_ms else None,
        "final_val_accuracy": recorder.epochs[-1]["val_accuracy"],
        "epochs_log": recorder.epochs,
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{model_name} {compressor_name} P={strategy.world_size}: final val_accuracy "
          f"{result['final_val_accuracy']:.4f}, {recorder.clock:.1f} s of training, "
          f"{recorder.epochs[-1]['sent_mb_per_step']:.3f} MB/step", flush=True)


if __name__ == "__main__":
    try:
        main()
    except BaseException:  # the driver puts the error in the results, next to the cell
        import traceback  # pylint: disable=import-outside-toplevel

        with open(f"{sys.argv[1]}.error.{os.getpid()}", "w") as f:
            f.write(traceback.format_exc())
        raise
