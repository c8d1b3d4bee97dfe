"""Peer benchmark worker: the same training under tfdist (Keras 3) or tf-keras + MWMS.

Usage: peer_worker.py OUT.json STRATEGY [--time [--epochs E]] [--exact DIR] [--models M ...]
                     [--bucket-mb MB]

STRATEGY picks the framework:
  ring | tree | ps   Keras 3 with tfdist's RingAllReduceStrategy(backend="collective"),
                     ReductionTreeStrategy() or ParameterServerStrategy() (under tfdist-run)
  horovod            Keras 3 with RingAllReduceStrategy(backend="horovod") (under
                     `tfdist-run` with Horovod installed: Gloo, or mpirun: MPI)
  mpi                Keras 3 with RingAllReduceStrategy(backend="mpi") (Open MPI's own
                     collectives; under mpirun or tfdist-run --mpi)
  auto               Keras 3 with RingAllReduceStrategy() (backend "auto": the engine
                     tfdist picks under the launcher)
  mwms               tf-keras (Keras 2, TF_USE_LEGACY_KERAS=1) with
                     tf.distribute.MultiWorkerMirroredStrategy (one process per worker,
                     TF_CONFIG); runs in the peer environment, so nothing here imports tfdist
  keras3 | tf_keras  one plain process of that framework, no strategy (the reference)

`--time` trains each model (the digits-sized CNN at global batch 64, 22 steps
per epoch, 5 epochs; the 5.8 M parameter MLP at 64 rows per process, 10 steps
per epoch, 4 epochs; or E epochs each) and times every step of the epochs
after the first (Keras' batch begin to batch end) and every epoch after the
first. `--exact DIR` then trains each model on 100 samples at
global batch 64 (last batch 36) for 2 epochs with plain SGD, from the
initial weights in DIR/init_<model>.npz (a one-process run writes them when
missing), and rank 0 saves its final weights to
DIR/<STRATEGY>_P<processes>_<model>.npz. Rank 0 writes OUT.json.
"""

import argparse
import collections
import contextlib
import json
import os
import re
import statistics
import time

import numpy as np

STARTED = time.perf_counter()
OUR_STRATEGIES = ("ring", "tree", "ps", "horovod", "mpi", "auto")
TF_KERAS = ("mwms", "tf_keras")
MODELS = ("cnn", "mlp")
CNN_SAMPLES, CNN_GLOBAL_BATCH = 22 * 64, 64
MLP_ROWS_PER_PROCESS, MLP_STEPS_PER_EPOCH = 64, 10
MLP_FEATURES, MLP_HIDDEN = 784, 2048
EPOCHS = {"cnn": 5, "mlp": 4}  # the first one untimed: 88 and 30 timed steps
EXACT_SAMPLES, EXACT_GLOBAL_BATCH, EXACT_EPOCHS = 100, 64, 2


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("strategy", choices=OUR_STRATEGIES + TF_KERAS + ("keras3",))
    parser.add_argument("--time", action="store_true", help="time both models' training")
    parser.add_argument("--epochs", type=int, default=None,
                        help=f"epochs per timed training, the first untimed (default {EPOCHS})")
    parser.add_argument("--exact", metavar="DIR", help="run the correctness check into DIR")
    parser.add_argument("--anatomy", action="store_true",
                        help="with --time and a tfdist strategy: count the step's collectives "
                             "(tfdist's communication counters) and time the train function")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS),
                        help="the models to train (default both)")
    parser.add_argument("--bucket-mb", type=float, default=None,
                        help="ring and horovod: largest gradient bucket in MiB (default the "
                             "strategy's)")
    parser.add_argument("--shard-optimizer-state", action="store_true",
                        help="ring, horovod and auto: "
                             "RingAllReduceStrategy(shard_optimizer_state=True)")
    parser.add_argument("--sharding", choices=("optimizer", "gradients", "parameters"),
                        default=None, help="ring, horovod, mpi and auto: "
                                           "RingAllReduceStrategy(sharding=...)")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd",
                        help="the timed models' optimizer (default SGD with momentum)")
    parser.add_argument("--cnn-batch", type=int, default=CNN_GLOBAL_BATCH,
                        help=f"the CNN's global batch (default {CNN_GLOBAL_BATCH}); a "
                             "no-communication floor process takes a P-process job's "
                             "per-process batch, 64 / P")
    parser.add_argument("--mlp-hidden", type=int, default=MLP_HIDDEN,
                        help=f"the MLP's hidden width (default {MLP_HIDDEN}: 5.8 M parameters)")
    args = parser.parse_args()
    if args.epochs is not None and args.epochs < 2:
        parser.error(f"--epochs must be >= 2 (the first is not timed). Got: {args.epochs}")
    return args


def load_framework(name, bucket_mb=None, shard_optimizer_state=False, sharding=None):
    """(keras, tensorflow, strategy or None, rank, processes, tfdist module or None)."""
    if name in TF_KERAS:
        os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow is imported
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    # One intra-op thread per process, in both frameworks: the processes share 2 cores.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    if name in TF_KERAS:
        import tf_keras as keras  # pylint: disable=import-outside-toplevel

        if name == "tf_keras":
            return keras, tf, None, 0, 1, None
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        return keras, tf, strategy, task["index"], strategy.num_replicas_in_sync, None
    import keras  # pylint: disable=import-outside-toplevel

    import tfdist  # pylint: disable=import-outside-toplevel

    if name == "keras3":
        return keras, tf, None, 0, 1, tfdist
    buckets = {} if bucket_mb is None else {"fusion_threshold_bytes": int(bucket_mb * 2**20)}
    if shard_optimizer_state:
        buckets["shard_optimizer_state"] = True
    if sharding is not None:
        buckets["sharding"] = sharding
    strategy = {"ring": lambda: tfdist.strategies.RingAllReduceStrategy(
                    backend="collective", **buckets),
                "horovod": lambda: tfdist.strategies.RingAllReduceStrategy(
                    backend="horovod", **buckets),
                "mpi": lambda: tfdist.strategies.RingAllReduceStrategy(
                    backend="mpi", **buckets),
                "auto": lambda: tfdist.strategies.RingAllReduceStrategy(**buckets),
                "tree": tfdist.strategies.ReductionTreeStrategy,
                "ps": tfdist.strategies.ParameterServerStrategy}[name]()
    return keras, tf, strategy, strategy.rank, strategy.world_size, tfdist


def build_model(keras, model, mlp_hidden=MLP_HIDDEN):
    if model == "cnn":  # examples/digits.py's model without its Dropout (exact comparisons)
        return keras.Sequential([
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ])
    return keras.Sequential([
        keras.Input((MLP_FEATURES,)),
        keras.layers.Dense(mlp_hidden, activation="relu"),
        keras.layers.Dense(mlp_hidden, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])


def make_data(model, samples, seed):
    rng = np.random.default_rng(seed)
    shape = (8, 8, 1) if model == "cnn" else (MLP_FEATURES,)
    x = rng.random((samples, *shape), dtype=np.float32)
    y = rng.integers(0, 10, samples).astype("int32")
    return x, y


def step_timer(keras, tfdist):
    """A callback timing each step and each epoch after the first."""

    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.steps, self.epochs = [], []
            self.epoch = self.step_start = self.epoch_start = None

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch, self.epoch_start = epoch, time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            if epoch > 0:
                self.epochs.append(time.perf_counter() - self.epoch_start)

        def on_train_batch_begin(self, batch, logs=None):
            self.step_start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch > 0:
                self.steps.append(time.perf_counter() - self.step_start)

    if tfdist is not None:  # it never stops training: no per-step stop-flag exchange
        StepTimer = tfdist.callbacks.agrees_across_ranks(StepTimer)
    return StepTimer()


def optimizer_bytes(optimizer):
    """Bytes of `optimizer`'s variables on this process (a sharded state: this rank's part)."""
    return sum(int(np.prod(v.shape))  # tf-keras' variables have tf.DType dtypes
               * np.dtype(getattr(v.dtype, "as_numpy_dtype", v.dtype)).itemsize
               for v in optimizer.variables)


def peak_rss_mb():
    """This process's peak resident memory, MB."""
    import resource  # pylint: disable=import-outside-toplevel

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb():
    """This process's resident memory now, MB (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0


def anatomy_probe(keras, tfdist, strategy, timer):
    """A callback that, from the second epoch, counts the step's communications (tfdist's
    counters: every collective a traced step issues, its name scope and bytes) and times each
    call of the train function (the rest of a step, batch begin to end, is Keras' and the
    callbacks' Python)."""
    if tfdist is None or strategy is None or strategy.world_size == 1:
        return None
    from tfdist.profiling.report import CommunicationReport  # pylint: disable=C0415

    class AnatomyProbe(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.report = CommunicationReport(strategy)
            self.function_seconds = []
            self.result = {}

        def on_train_begin(self, logs=None):
            counters = strategy.extended.communication_counters
            if hasattr(counters, "traced_calls"):  # (an older tfdist's counters do not list)
                counters.traced_calls.clear()
            self.report.start(self.model)  # traces the step again, counted
            function = self.model.train_function
            seconds = self.function_seconds

            def timed(*args, **kwargs):
                begin = time.perf_counter()
                try:
                    return function(*args, **kwargs)
                finally:
                    if timer.epoch:
                        seconds.append(time.perf_counter() - begin)

            self.model.train_function = timed

        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                self.report.take()

        def on_train_end(self, logs=None):
            counters = strategy.extended.communication_counters
            measured = self.report.take()
            snapshot = counters.snapshot()
            def phase(scope):  # "tfdist/ring/gradients_65/" -> "tfdist/ring/gradients"
                return re.sub(r"_\d+$", "", scope.rstrip("/"))

            traced = getattr(counters, "traced_calls", [])
            calls = collections.Counter(phase(scope) for scope, _ in traced)
            sizes = collections.defaultdict(list)
            for scope, size in traced:
                sizes[phase(scope)].append(size)
            self.result = {
                "communication": measured,
                "collectives_per_step": snapshot.calls / max(snapshot.steps, 1),
                "traced_collectives": [{"scope": scope, "count": count,
                                        "payload_bytes": sizes[scope]}
                                       for scope, count in sorted(calls.items())],
                "median_function_ms": 1e3 * statistics.median(self.function_seconds),
                "median_python_ms": 1e3 * (statistics.median(timer.steps)
                                           - statistics.median(self.function_seconds)),
            }

    AnatomyProbe = tfdist.callbacks.agrees_across_ranks(AnatomyProbe)
    return AnatomyProbe()


def time_model(keras, tfdist, strategy, processes, model_name, epochs, optimizer="sgd",
               mlp_hidden=MLP_HIDDEN, cnn_batch=CNN_GLOBAL_BATCH, anatomy=False):
    if model_name == "cnn":
        global_batch, samples = cnn_batch, CNN_SAMPLES
    else:
        global_batch = MLP_ROWS_PER_PROCESS * processes
        samples = global_batch * MLP_STEPS_PER_EPOCH
    x, y = make_data(model_name, samples, seed=0)
    keras.utils.set_random_seed(0)
    rss_before_model = rss_mb()
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = build_model(keras, model_name, mlp_hidden)
        model.compile(optimizer=(keras.optimizers.Adam(1e-3) if optimizer == "adam" else
                                 keras.optimizers.SGD(0.05, momentum=0.9)),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    timer = step_timer(keras, tfdist)
    callbacks = [timer]
    probe = anatomy_probe(keras, tfdist, strategy, timer) if anatomy else None
    if probe is not None:
        callbacks.append(probe)
    start = time.perf_counter()
    model.fit(x, y, batch_size=global_batch, epochs=epochs, shuffle=False, verbose=0,
              callbacks=callbacks)
    fit_seconds = time.perf_counter() - start
    median = statistics.median(timer.steps)
    extra = {"anatomy": probe.result} if probe is not None else {}
    return {**extra, "fit_seconds": fit_seconds, "global_batch": global_batch, "samples": samples,
            "epochs": epochs, "parameters": int(model.count_params()),
            "steps_timed": len(timer.steps), "median_step_ms": 1e3 * median,
            "mean_step_ms": 1e3 * statistics.fmean(timer.steps),
            "seconds_per_epoch": statistics.median(timer.epochs),
            # an epoch's wall time per step, its boundary included (what Keras prints as
            # ms/step): the per-epoch costs spread over the epoch's steps
            "wall_ms_per_step": 1e3 * statistics.median(timer.epochs) / -(-samples // global_batch),
            "epoch_seconds": timer.epochs, "optimizer": optimizer,
            "optimizer_bytes": optimizer_bytes(model.optimizer), "peak_rss_mb": peak_rss_mb(),
            "training_rss_mb": rss_mb() - rss_before_model,
            # the peak over what the process held before the model existed (TensorFlow's own)
            "peak_training_rss_mb": peak_rss_mb() - rss_before_model}


def exact_model(keras, strategy, processes, rank, name, model_name, directory):
    """Train from the saved initial weights on an uneven last batch; rank 0 saves the result."""
    x, y = make_data(model_name, EXACT_SAMPLES, seed=1)
    init = os.path.join(directory, f"init_{model_name}.npz")
    keras.utils.set_random_seed(1)
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = build_model(keras, model_name)
        if os.path.exists(init):
            with np.load(init) as saved:
                model.set_weights([saved[f"arr_{i}"] for i in range(len(saved.files))])
        elif processes == 1:
            np.savez(init, *model.get_weights())
        else:
            raise FileNotFoundError(f"{init}: run a one-process reference first")
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss="sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=EXACT_GLOBAL_BATCH, epochs=EXACT_EPOCHS, shuffle=False,
              verbose=0)
    path = os.path.join(directory, f"{name}_P{processes}_{model_name}.npz")
    if rank == 0:
        np.savez(path, *model.get_weights())
    return path


def main():
    args = parse_args()
    keras, tf, strategy, rank, processes, tfdist = load_framework(
        args.strategy, args.bucket_mb, args.shard_optimizer_state, args.sharding)
    result = {"strategy": args.strategy, "processes": processes,
              "framework": "tf_keras" if args.strategy in TF_KERAS else "keras3",
              "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
              "startup_seconds": time.perf_counter() - STARTED, "models": {}, "exact": {}}
    if getattr(strategy, "backend", None) is not None:  # the engine a ring strategy runs on
        result["backend"] = strategy.backend
    if args.time:
        for model_name in args.models:
            result["models"][model_name] = time_model(keras, tfdist, strategy, processes,
                                                      model_name,
                                                      args.epochs or EPOCHS[model_name],
                                                      args.optimizer, args.mlp_hidden,
                                                      args.cnn_batch, args.anatomy)
    if args.exact:
        for model_name in args.models:
            result["exact"][model_name] = exact_model(keras, strategy, processes, rank,
                                                      args.strategy, model_name, args.exact)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)
    elif args.time:  # each rank's memory (a sharded optimizer state differs per rank)
        with open(f"{args.out}.rank{rank}", "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
