"""`tfdist-bench --only horovod_api`: Horovod's synthetic benchmark on `tfdist.horovod.keras` vs a
tfdist strategy, images/s on the same model, processes and engine.

The measurement is Horovod's `tensorflow2_keras_synthetic_benchmark.py`
(a `keras.applications` model, one synthetic batch repeated, SGD(0.01),
`fit` with `steps_per_epoch` batches per iteration; images/s of every
iteration after the first, per process, times the number of processes),
written here in two forms that train the same thing:

* `hvd`: the Horovod script's form - `hvd.init()`, no scope, each rank
  feeds its own batch of B rows, `hvd.DistributedOptimizer`,
  `BroadcastGlobalVariablesCallback(0)` and `MetricAverageCallback()`;
* `strategy`: the same model under `RingAllReduceStrategy().scope()`, every
  rank given the global batch of P x B rows (tfdist slices it).

Both run under tfdist-run (TensorFlow's collectives) and, when Horovod is
installed, `tfdist-run --horovod` (Horovod's engine on Gloo). Rounds
alternate the order; the ratio hvd / strategy is taken per round, then the
median. Result: benchmarks/results/horovod_api.json.

    python -m benchmarks.horovod_api [--processes 2] [--rounds 3] [--model MobileNetV2]
    python benchmarks/horovod_api.py --worker hvd|strategy OUT [--model M] [--size S] ...
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = "MobileNetV2"
IMAGE_SIZE = 96  # Horovod's default 224 takes minutes per iteration on a 2-core host
BATCH = 16  # rows per process per step (Horovod's --batch-size)
BATCHES_PER_ITER = 5
ITERS = 4  # the first is the warm-up, not counted (as Horovod's)
ROUNDS = 3


def worker(mode, out, model_name, size, batch, batches_per_iter, iters):
    """One process of one form (see the module docstring); writes images/s to `out`."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if mode == "hvd":
        import tfdist.horovod.keras as hvd  # pylint: disable=import-outside-toplevel

        hvd.init()
        world, rank = hvd.size(), hvd.rank()
        rows = batch
    else:
        import tfdist  # pylint: disable=import-outside-toplevel

        strategy = tfdist.strategies.RingAllReduceStrategy()
        world, rank = strategy.world_size, strategy.rank
        rows = batch * world  # the global batch: tfdist gives each rank its `batch` rows
    from tensorflow.keras import applications  # pylint: disable=import-outside-toplevel

    def build():
        model = getattr(applications, model_name)(weights=None,
                                                  input_shape=(size, size, 3))
        optimizer = tf.optimizers.SGD(0.01)
        if mode == "hvd":
            optimizer = hvd.DistributedOptimizer(optimizer)
        model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=optimizer)
        return model

    if mode == "hvd":
        model = build()
    else:
        with strategy.scope():
            model = build()
    data = tf.random.uniform([rows, size, size, 3], seed=1)
    target = tf.random.uniform([rows, 1], minval=0, maxval=999, dtype=tf.int64, seed=2)
    dataset = tf.data.Dataset.from_tensor_slices((data, target)).cache().repeat().batch(rows)

    class Timing(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.img_secs = []

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            seconds = time.perf_counter() - self.start
            if epoch > 0:
                self.img_secs.append(batch * batches_per_iter / seconds)

    timing = Timing()
    callbacks = [timing]
    if mode == "hvd":
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                     hvd.callbacks.MetricAverageCallback(), timing]
    model.fit(dataset, steps_per_epoch=batches_per_iter, epochs=iters, callbacks=callbacks,
              verbose=0)
    if rank == 0:
        per_process = float(np.mean(timing.img_secs))
        with open(out, "w") as f:
            json.dump({"img_sec_per_process": per_process,
                       "total_img_sec": per_process * world, "processes": world,
                       "img_secs": timing.img_secs}, f)


def _launch(mode, processes, engine_flags, out, args):
    command = [sys.executable, "-m", "tfdist.launch", "-np", str(processes), "--timeout", "300",
               *engine_flags, sys.executable, os.path.abspath(__file__), "--worker", mode, out,
               "--model", args.model, "--size", str(args.size), "--batch", str(args.batch),
               "--batches-per-iter", str(args.batches_per_iter), "--iters", str(args.iters)]
    print("$", " ".join(command[2:]), flush=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run(command, env=env, check=True, timeout=1800)
    with open(out) as f:
        return json.load(f)


def run(tmp, rounds=ROUNDS, processes=2, args=None):
    """Interleaved rounds of both forms on each engine; writes horovod_api.json."""
    from benchmarks.harness import write_result  # pylint: disable=import-outside-toplevel

    args = args or argparse.Namespace(model=MODEL, size=IMAGE_SIZE, batch=BATCH,
                                      batches_per_iter=BATCHES_PER_ITER, iters=ITERS)
    engines = {"collective": []}
    if importlib.util.find_spec("horovod") is not None:
        engines["horovod"] = ["--horovod"]
    start = time.perf_counter()
    runs = {(engine, mode): [] for engine in engines for mode in ("hvd", "strategy")}
    for round_ in range(rounds):
        modes = ("hvd", "strategy") if round_ % 2 == 0 else ("strategy", "hvd")
        for engine, flags in engines.items():
            for mode in modes:
                out = os.path.join(tmp, f"horovod_api_{engine}_{mode}_{round_}.json")
                runs[engine, mode].append(_launch(mode, processes, flags, out, args))
    rows, summary = [], {}
    for engine in engines:
        hvd_runs, strategy_runs = runs[engine, "hvd"], runs[engine, "strategy"]
        ratios = [h["total_img_sec"] / s["total_img_sec"]
                  for h, s in zip(hvd_runs, strategy_runs)]
        row = {"engine": engine, "processes": processes,
               "hvd_total_img_sec": statistics.median(r["total_img_sec"] for r in hvd_runs),
               "strategy_total_img_sec": statistics.median(r["total_img_sec"]
                                                           for r in strategy_runs),
               "hvd_over_strategy_per_round": ratios,
               "hvd_over_strategy": statistics.median(ratios)}
        rows.append(row)
        summary[f"{engine}_hvd_over_strategy"] = round(row["hvd_over_strategy"], 3)
        summary[f"{engine}_hvd_total_img_sec"] = round(row["hvd_total_img_sec"], 1)
    result = {
        "summary": summary, "rows": rows, "rounds": rounds,
        "runs": {f"{e}_{m}": r for (e, m), r in runs.items()},
        "minutes": round((time.perf_counter() - start) / 60, 1),
        "description": (
            f"Horovod's synthetic benchmark measurement: keras.applications.{args.model} "
            f"(weights=None, {args.size}x{args.size}x3), one synthetic batch repeated, "
            f"SGD(0.01), {args.batch} images per process per step, {args.batches_per_iter} "
            f"steps per iteration, {args.iters} iterations (the first not counted); "
            "total img/s = mean img/s per process x processes. hvd = tfdist.horovod.keras "
            "(per-rank batches, DistributedOptimizer, broadcast and metric-average callbacks); "
            "strategy = RingAllReduceStrategy scope, global batch given to fit. Both under "
            "tfdist-run on each engine (collective: TensorFlow's ring over gRPC; horovod: "
            "tfdist-run --horovod, Gloo). hvd_over_strategy: per-round ratio of total img/s, "
            "median over rounds; rounds alternate the order."),
    }
    write_result("horovod_api.json", result)
    print(f"horovod_api: {result['minutes']} min", flush=True)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=2, metavar=("MODE", "OUT"))
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--size", type=int, default=IMAGE_SIZE)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--batches-per-iter", type=int, default=BATCHES_PER_ITER)
    parser.add_argument("--iters", type=int, default=ITERS)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    if args.worker:
        mode, out = args.worker
        worker(mode, out, args.model, args.size, args.batch, args.batches_per_iter, args.iters)
        return
    import tempfile  # pylint: disable=import-outside-toplevel

    sys.path.insert(0, os.path.dirname(HERE))
    with tempfile.TemporaryDirectory() as tmp:
        run(tmp, args.rounds, args.processes, args)


if __name__ == "__main__":
    main()
