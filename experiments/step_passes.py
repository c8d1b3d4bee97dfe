"""Where the MPI engine's share of a big model's step goes: the all-reduce and the passes around it.

For issue 65 (the 5.8 M MLP's 2-process step within 1.25x of the no-communication
floor): on the MPI engine the step was 1.27x the floor, 10 ms over it, and the
all-reduce in place explained only part of that. A synchronous step makes every
rank's gradient count by its share of the global batch; weighted after the sum,
that is one element-wise multiply before the all-reduce (by the rank's rows n_r)
and one divide after it (by the global rows n). This script times, in one job of
`mpirun -np 2`, each piece on the MLP's 23.2 MB of float32 inside a `tf.function`,
each call starting from a fresh gradient-like tensor (`x * 1.0001`, one pass: what
the backward pass hands the step):

* `fresh_tensor_only`: the fresh tensor alone (the baseline every row includes);
* `all_reduce`: then the MPI engine's all-reduce (in place: the tensor is forwardable);
* `multiply_all_reduce_divide`: weighted after the sum, as the step did:
  `divide_no_nan(all_reduce(multiply_no_nan(g, n_r)), n)`;
* `multiply_all_reduce`: weighted before the sum by the share (n known first);
* `cond_all_reduce`: the gradient of a loss that carried the share, passed through a
  `tf.cond` on "this slice has rows" (zeros for an empty one), then summed;
* `multiply_alone`: one multiply, no all-reduce;
* `small_all_reduce_x5` against `small_nothing`: five chained all-reduces of one float
  (learning the row count first) against the same function without them.

Each: the median of 40 calls, the configurations interleaved, every call started by a
barrier. Rank 0 writes `experiments/results/step_passes.json`.

    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \\
        mpirun --bind-to core -np 2 .venv/bin/python -m experiments.step_passes
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

from benchmarks.harness import environment  # noqa: E402
from tfdist.comm import mpi_kernels  # noqa: E402

ELEMENTS = 5_800_000  # the 5.8 M MLP's gradient, float32: 23.2 MB
WARMUP, CALLS = 3, 40
COMM = MPI.COMM_WORLD


def main(out=None, only=None):
    all_reduce = mpi_kernels.ops().tfdist_mpi_allreduce
    x = tf.Variable(tf.random.uniform([ELEMENTS], seed=COMM.Get_rank()))
    rows, global_rows, share = tf.constant(32.0), tf.constant(64.0), tf.constant(0.5)
    has_rows = tf.Variable(True)
    small = tf.constant([1.0])

    def kept(g):
        return tf.cond(has_rows, lambda: g, lambda: tf.zeros_like(g))

    pieces = {
        "fresh_tensor_only": lambda g: g,
        "all_reduce": all_reduce,
        "multiply_all_reduce_divide": lambda g: tf.math.divide_no_nan(
            all_reduce(tf.math.multiply_no_nan(g, rows)), global_rows),
        "multiply_all_reduce": lambda g: all_reduce(tf.math.multiply_no_nan(g, share)),
        "cond_all_reduce": lambda g: all_reduce(kept(g)),
        "multiply_alone": lambda g: tf.math.multiply_no_nan(g, share),
    }
    functions = {name: tf.function(lambda piece=piece: tf.reduce_sum(piece(x * 1.0001)[:8]))
                 for name, piece in pieces.items()}

    def five_small():
        total = small * 2.0
        for _ in range(5):
            total = all_reduce(total)
        return tf.reduce_sum(total)

    functions["small_nothing"] = tf.function(lambda: tf.reduce_sum(small * 2.0))
    functions["small_all_reduce_x5"] = tf.function(five_small)
    if only:
        functions = {name: f for name, f in functions.items()
                     if name in only or name.startswith("small")}
    for function in functions.values():
        for _ in range(WARMUP):
            function().numpy()
    seconds = {name: [] for name in functions}
    for _ in range(CALLS):
        for name, function in functions.items():
            COMM.Barrier()
            start = time.perf_counter()
            function().numpy()
            seconds[name].append(time.perf_counter() - start)
    if COMM.Get_rank() == 0:
        median = {name: round(1000 * statistics.median(v), 3) for name, v in seconds.items()}
        base = median["fresh_tensor_only"]
        result = {
            "description": __doc__.split("\n\n", 1)[0],
            "processes": COMM.Get_size(), "elements": ELEMENTS, "calls": CALLS,
            "median_ms": median,
            "mca": {k: v for k, v in os.environ.items() if k.startswith("OMPI_MCA_")},
            "over_fresh_tensor_ms": {name: round(value - base, 3) for name, value in
                                     median.items() if not name.startswith("small")},
            "five_small_all_reduces_ms": round(median["small_all_reduce_x5"]
                                               - median["small_nothing"], 3),
            "quartiles_ms": {name: [round(1000 * q, 3) for q in
                                    statistics.quantiles(v, n=4)] for name, v in seconds.items()},
            "environment": environment(),
        }
        path = out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   "step_passes.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        print(json.dumps(result["over_fresh_tensor_ms"]), result["five_small_all_reduces_ms"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--out", default=None, help="result file (default: results/...)")
    parser.add_argument("--only", nargs="+", default=None,
                        help="these pieces (with fresh_tensor_only and the small ones)")
    arguments = parser.parse_args()
    main(arguments.out, arguments.only and ["fresh_tensor_only", *arguments.only])
