"""`tfdist-bench --only billion`: a model that does not fit two unsharded processes trains sharded.

A 14-layer MLP of 8192-wide Dense layers (0.94 billion float32 parameters)
trained with Adam keeps 16 bytes a parameter unsharded - 15 GB of state for
one process (its peak: 14.2 GB measured), so two data-parallel processes
(about 28 GB) cannot live on a 24 GB machine while one can. With `RingAllReduceStrategy(sharding="parameters")`
(ZeRO stage 3) each of 2 processes stores half of the parameters, gradients
and Adam state. This runs:

1. the plain script (no tfdist), one process: the reference;
2. the same script under `tfdist-run -np 2` with `sharding="parameters"`;

each for `--steps` steps of a global batch of 8 rows, and compares the loss
of every step and each layer's kernel digest (sum, sum of squares, first 64
elements) with the reference, and records each process's peak resident
memory. Needs about 20 GB of free memory; run alone. (16 layers, 1.07 billion
parameters, needed 2 x 12 GB sharded here: each process also holds about 2.3 GB
that does not shrink with P - TensorFlow, Open MPI, a layer's gathered
parameters and gradient, the update's temporaries - measured at 2, 4 and 8
layers: 2.3 GB + 0.54 GB a layer, the 8 bytes a parameter that stage 3
leaves each of 2 processes.)

Result: benchmarks/results/billion_parameters.json.

    python -m benchmarks.billion_parameters [--steps 3] [--layers 16] [--width 8192]
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from benchmarks.harness import write_result

LAYERS = 14
WIDTH = 8192
STEPS = 3
BATCH = 8
RTOL = 1e-4


def train(out, steps, layers, width, sharded):
    """The script: plain Keras, or under tfdist-run with the parameters sharded."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import keras  # pylint: disable=import-outside-toplevel

    strategy = tf.distribute.get_strategy()
    rank = 0
    if sharded:
        import tfdist  # pylint: disable=import-outside-toplevel
        strategy = tfdist.strategies.RingAllReduceStrategy(sharding="parameters")
        rank = strategy.rank
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * steps, width)).astype("float32")
    y = rng.normal(size=(BATCH * steps, width)).astype("float32") * 0.1
    started = time.perf_counter()
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential(
            [keras.Input((width,))]
            + [keras.layers.Dense(width, activation="tanh",
                                  kernel_initializer=keras.initializers.RandomNormal(
                                      stddev=1.0 / width ** 0.5))
               for _ in range(layers - 1)]
            + [keras.layers.Dense(width)])
        model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")
    built = time.perf_counter() - started
    step_losses = []

    class PerStep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            step_losses.append(float(logs["loss"]))

    history = model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                        callbacks=[PerStep()])
    digests = []
    for layer in model.layers:
        kernel = np.asarray(layer.kernel.numpy(), dtype=np.float64)  # every rank reads
        digests.append([float(kernel.sum()), float((kernel ** 2).sum())]
                       + [float(v) for v in kernel.reshape(-1)[:64]])
    result = {"rank": rank, "parameters": int(model.count_params()),
              "epoch_losses": [float(v) for v in history.history["loss"]],
              "step_losses": step_losses, "kernel_digests": digests,
              "build_seconds": built, "seconds": time.perf_counter() - started,
              "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
              "stored_parameter_elements": int(sum(
                  int(np.prod(v.value.shape)) for v in model.trainable_variables)),
              "optimizer_elements": int(sum(int(np.prod(v.shape))
                                            for v in model.optimizer.variables))}
    with open(out if rank == 0 else f"{out}.rank{rank}", "w") as f:
        json.dump(result, f)


def _run(command):
    print("$", " ".join(command), flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}")
    return time.perf_counter() - started


def _relative(a, b):
    return abs(a - b) / max(abs(b), 1e-6)


def run(tmp, steps=STEPS, layers=LAYERS, width=WIDTH):
    me = [sys.executable, "-m", "benchmarks.billion_parameters", "--worker"]
    shape = ["--steps", str(steps), "--layers", str(layers), "--width", str(width)]
    plain_out = os.path.join(tmp, "plain.json")
    sharded_out = os.path.join(tmp, "sharded.json")
    wall = {"plain": _run(me + [plain_out] + shape),
            "sharded": _run([sys.executable, "-m", "tfdist.launch", "-np", "2", "--timeout",
                             "1200"] + me + [sharded_out, "--sharded"] + shape)}
    with open(plain_out) as f:
        plain = json.load(f)
    ranks = []
    for rank in range(2):
        with open(sharded_out if rank == 0 else f"{sharded_out}.rank{rank}") as f:
            ranks.append(json.load(f))
    worst = 0.0
    for arrays in ranks:
        for key in ("epoch_losses", "step_losses"):
            for a, b in zip(arrays[key], plain[key]):
                worst = max(worst, _relative(a, b))
        for mine, theirs in zip(arrays["kernel_digests"], plain["kernel_digests"]):
            worst = max(worst, max(abs(a - b) for a, b in zip(mine[2:], theirs[2:])),
                        _relative(mine[0], theirs[0]) if abs(theirs[0]) > 1 else 0.0,
                        _relative(mine[1], theirs[1]))
    result = {
        "model": f"{layers} Dense layers of {width}x{width}, Adam, global batch {BATCH}",
        "parameters": plain["parameters"],
        "unsharded_bytes_per_process_gb": round(16 * plain["parameters"] / 2**30, 2),
        "plain_peak_rss_gb": round(plain["peak_rss_gb"], 2),
        "sharded_peak_rss_gb_per_rank": [round(r["peak_rss_gb"], 2) for r in ranks],
        "sharded_stored_parameter_elements_per_rank": [r["stored_parameter_elements"]
                                                       for r in ranks],
        "optimizer_elements": {"plain": plain["optimizer_elements"],
                               "sharded_per_rank": [r["optimizer_elements"] for r in ranks]},
        "losses": {"plain": plain["step_losses"], "sharded": ranks[0]["step_losses"]},
        "worst_difference": worst, "within_tolerance": worst <= RTOL, "tolerance": RTOL,
        "wall_seconds": wall}
    write_result("billion_parameters.json", result)
    print(json.dumps(result, indent=1))
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sharded", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--width", type=int, default=WIDTH)
    args = parser.parse_args(argv)
    if args.worker:
        return train(args.worker, args.steps, args.layers, args.width, args.sharded)
    with tempfile.TemporaryDirectory() as tmp:
        return run(tmp, args.steps, args.layers, args.width)


if __name__ == "__main__":
    main()
