"""All-reduce benchmark worker (run under tfdist-run; rank 0 writes JSON).

For each payload size, times in the same process and interleaved:
  raw        one TensorFlow `all_reduce_v2` of the payload (the engine alone);
  tfdist     tfdist's RingAllReduceAggregator on the same single tensor;
  tfdist_16  the same bytes as 16 tensors through the aggregator (fused);
  unfused_16 the 16 tensors as 16 raw `all_reduce_v2` calls (no fusion).
Bus bandwidth follows the NCCL convention: 2 (P - 1) / P * bytes / time.
"""

import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from tfdist import _tf, runtime  # noqa: E402
from tfdist.aggregation.ring import RingAllReduceAggregator  # noqa: E402
from tfdist.comm.tf_collective import WORLD_GROUP_KEY  # noqa: E402

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
PIECES = 16


def make_methods(communicator):
    aggregator = RingAllReduceAggregator(communicator)
    world = communicator.world_size

    def raw(tensors):
        with tf.device(communicator.device):
            # No op timeout, as tfdist inside compiled functions (see tf_collective).
            return [_tf.all_reduce_v2(t, world, WORLD_GROUP_KEY, communicator.instance_key(),
                                      communication_hint="ring", timeout=0.0)
                    for t in tensors]

    return {
        "raw": (raw, 1),
        "tfdist": (aggregator.all_reduce, 1),
        "tfdist_16": (aggregator.all_reduce, PIECES),
        "unfused_16": (raw, PIECES),
    }


def time_interleaved(methods, nbytes, rounds):
    """Seconds of every call of each method; methods alternate within every round
    (in rotating order) so that machine noise hits all of them alike."""
    return {name: [end - start for start, end in spans]
            for name, spans in spans_interleaved(methods, nbytes, rounds).items()}


def spans_interleaved(methods, nbytes, rounds, before_each=None):
    """(start, end) of every call of each method on this process's monotonic clock
    (`time.perf_counter`, shared by the processes of one machine), interleaved as in
    `time_interleaved`, after two warm-up calls of each. `before_each`, if given, runs
    untimed before every timed call (e.g. a barrier: every process enters each call
    together, so that none does part of the work before the others arrive)."""
    compiled = {}
    for name, (fn, pieces) in methods.items():
        tensors = [tf.ones([nbytes // 4 // pieces]) for _ in range(pieces)]
        function = tf.function(fn)
        for _ in range(2):
            function(tensors)[0].numpy()
        compiled[name] = (function, tensors)
    names = list(compiled)
    spans = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            function, tensors = compiled[name]
            if before_each is not None:
                before_each()
            start = time.perf_counter()
            function(tensors)[0].numpy()
            spans[name].append((start, time.perf_counter()))
    return spans


def measure(methods, nbytes, world):
    """{method: median/min time and bus bandwidth} for one payload size."""
    # Fixed round counts keep all ranks in step (no rank-local decisions).
    rounds = 40 if nbytes <= (1 << 20) else 12 if nbytes <= (16 << 20) else 6
    stats = {}
    for name, times in time_interleaved(methods, nbytes, rounds).items():
        median = statistics.median(times)
        stats[name] = {
            "median_ms": median * 1e3,
            "min_ms": min(times) * 1e3,
            "iterations": len(times),
            "bus_bandwidth_MBps": 2 * (world - 1) / world * nbytes / median / 1e6,
        }
    return stats


def add_ratios(row, ratios, show):
    """row[name] = median of a / median of b for each name: (a, b); print the row if `show`."""
    for name, (a, b) in ratios.items():
        row[name] = row[a]["median_ms"] / row[b]["median_ms"]
    if show:
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                          for k, v in row.items() if not isinstance(v, dict)}), flush=True)


def collective_and_horovod():
    """Both engines' communicators in one process (under `tfdist-run --horovod`).

    TensorFlow's collective server must start before any TensorFlow op runs,
    and Horovod's initialization runs some: collectives first.
    """
    collective = runtime.communicator("collective")
    return collective, runtime.communicator("horovod")


def output_and_sizes(argv):
    """(OUT.json, payload sizes) from a worker's command line: OUT.json [SIZES]."""
    return argv[1], [int(s) for s in argv[2].split(",")] if len(argv) > 2 else SIZES


def run_sizes(out, sizes, methods, ratios, rank, world, **fields):
    """Measure every size, print each row's ratios on rank 0, and write the rows there.

    Returns the rows (on every rank)."""
    rows = []
    for nbytes in sizes:
        row = {"bytes": nbytes, "processes": world, **fields}
        row.update(measure(methods, nbytes, world))
        add_ratios(row, ratios, rank == 0)
        rows.append(row)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


def main():
    out, sizes = output_and_sizes(sys.argv)
    communicator = runtime.communicator()
    run_sizes(out, sizes, make_methods(communicator),
              {"tfdist_over_raw": ("tfdist", "raw"),
               "tfdist_16_over_raw": ("tfdist_16", "raw"),
               "unfused_16_over_tfdist_16": ("unfused_16", "tfdist_16")},
              communicator.rank, communicator.world_size)


if __name__ == "__main__":
    main()
