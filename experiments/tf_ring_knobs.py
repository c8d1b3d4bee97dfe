"""Why TensorFlow's gRPC ring all-reduce moves ~0.3-0.4 GB/s on one host, and which knob helps.

Question (issue: big models engine-bound): is the TF ring's bus bandwidth at 2 processes on
this host limited by something TensorFlow lets us set - the ring's subdivisions
(`max_subdivs_per_device`), several all-reduces in flight at once (a bucket split in k),
gRPC's chunking of a transfer (`ConfigProto.experimental.recv_buf_max_chunk`) or gRPC
channels per peer (`rpc_options.num_channels_per_target`) - or by the transport itself?

    .venv/bin/python -m experiments.tf_ring_knobs experiments/results/tf_ring_knobs.json

The driver launches, for each gRPC configuration and in alternating rounds, two processes
(`tfdist-run -np 2`) that time, interleaved within each payload size (4, 23 and 64 MB:
23 MB is the 5.8 M-parameter MLP's gradient), a raw `all_reduce_v2` at each subdivision
count and the payload split into 4 concurrent all-reduces; plus a single-process
`np.copyto` of the payload (the host's memory-copy rate, the ceiling any transport
on one host copies against). Bus bandwidth: 2 (P - 1) / P bytes / median time.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CONFIGS = {  # name: (recv_buf_max_chunk or None, num_channels_per_target or None)
    "default": (None, None),
    "chunk_unlimited": (0, None),
    "chunk_64KiB": (65536, None),
    "chunk_64MiB": (64 << 20, None),
    "channels_4": (None, 4),
}
SIZES = (4 << 20, 23 << 20, 64 << 20)
ROUNDS = 2


def worker(out):
    """One process of a launch: time every method at every size; rank 0 writes `out`."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel

    from benchmarks.allreduce import time_interleaved  # pylint: disable=import-outside-toplevel
    from tfdist import _tf, runtime  # pylint: disable=import-outside-toplevel
    from tfdist.comm.tf_collective import WORLD_GROUP_KEY  # pylint: disable=import-outside-toplevel

    chunk, channels = json.loads(os.environ["TF_RING_KNOBS"])
    start_server = _tf.start_collective_server

    def start_with_knobs(worker_addresses, rank, leader_rank=0):
        """tfdist's server start, with the knobs set in the session config it serves with."""
        config_of = context.Context.config.fget

        def config_with_knobs(ctx):
            config = config_of(ctx)
            if chunk is not None:
                config.experimental.recv_buf_max_chunk = chunk
            if channels is not None:
                config.rpc_options.num_channels_per_target = channels
            return config

        context.Context.config = property(config_with_knobs)
        try:
            start_server(worker_addresses, rank, leader_rank)
        finally:
            context.Context.config = property(config_of)

    _tf.start_collective_server = start_with_knobs
    communicator = runtime.communicator()
    world = communicator.world_size

    def all_reduce(subdivs):
        def run(tensors):
            with tf.device(communicator.device):
                return [_tf.all_reduce_v2(t, world, WORLD_GROUP_KEY, communicator.instance_key(),
                                          communication_hint="ring", timeout=0.0,
                                          max_subdivs_per_device=subdivs) for t in tensors]
        return run

    methods = {f"subdivs_{s}": (all_reduce(s), 1) for s in (-1, 1, 8, 16)}
    methods["split_4"] = (all_reduce(-1), 4)
    rows = []
    for nbytes in SIZES:
        times = time_interleaved(methods, nbytes, 6)
        row = {"bytes": nbytes}
        row.update({name: 2 * (world - 1) / world * nbytes / statistics.median(t) / 1e9
                    for name, t in times.items()})
        source = np.ones(nbytes // 4, np.float32)
        target = np.empty_like(source)
        start = time.perf_counter()
        for _ in range(10):
            np.copyto(target, source)
        row["memcpy"] = 10 * nbytes / (time.perf_counter() - start) / 1e9
        rows.append(row)
    if communicator.rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)


def driver(out):
    from benchmarks.harness import environment  # pylint: disable=import-outside-toplevel

    runs = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(ROUNDS):
            names = list(CONFIGS) if round_index % 2 == 0 else list(reversed(CONFIGS))
            for name in names:
                path = os.path.join(tmp, f"{name}{round_index}.json")
                env = dict(os.environ, TF_RING_KNOBS=json.dumps(CONFIGS[name]))
                subprocess.run([sys.executable, "-m", "tfdist.launch", "-np", "2",
                                sys.executable, "-m", "experiments.tf_ring_knobs", "--worker",
                                path], check=True, env=env)
                with open(path) as f:
                    runs[name].append(json.load(f))
    table = {name: {str(size): {method: round(statistics.median(
        rows[i][method] for rows in runs[name]), 3) for method in runs[name][0][i]
        if method != "bytes"} for i, size in enumerate(SIZES)} for name in CONFIGS}
    result = {
        "description": "TF collectives ring all-reduce at P = 2 on one host: bus bandwidth "
                       "(GB/s, 2 (P - 1) / P bytes / median time) per gRPC configuration "
                       "(launch), payload size and method (ring subdivisions, 4 concurrent "
                       "all-reduces), medians over rounds; memcpy: np.copyto of the payload "
                       "in one process (GB/s).",
        "summary": table, "rounds": runs, "environment": environment()}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        driver(sys.argv[1])
