"""`tfdist-bench --only sharding`: what optimizer-state sharding (ZeRO stage 1) saves and costs.

The 784-2048-2048-10 MLP (5.8 M parameters) trained with Adam (two slots per
parameter: 46.6 MB of optimizer state) by `benchmarks/peer_worker.py` (64 rows
per process, one intra-op thread per process):

* memory: at P = 1, 2 and 4 processes under tfdist-run, unsharded and
  `shard_optimizer_state=True`, every rank's optimizer bytes (its
  `optimizer.variables`), peak resident memory (`ru_maxrss`, most of it
  TensorFlow's own ~0.8 GB) and training memory (resident memory after 2 epochs
  less before the model was built: parameters, gradients, optimizer state and
  the step's buffers);
* step time at P = 2: unsharded and sharded on each engine - TensorFlow's
  collectives ("ring") and Horovod's on Gloo ("horovod", when installed) - and
  the no-communication floor (2 plain Keras processes, each pinned to its own core with one
  intra-op thread: the fair floor), in interleaved rounds
  (the order alternates); ratios per round to the same round's unsharded step
  on that engine and to the floor, medians over rounds.

Result: benchmarks/results/optimizer_sharding.json and optimizer_sharding.png.

    python -m benchmarks.optimizer_sharding [--rounds 3] [--memory-processes 1 2 4]
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks import peer_report
from benchmarks.harness import HERE, fair_floor_process, write_result
from benchmarks.plotting import pyplot, save

WORKER = os.path.join(HERE, "peer_worker.py")
ROUNDS = 3
MEMORY_PROCESSES = (1, 2, 4)
TIME_PROCESSES = 2
TIME_EPOCHS = 4  # the first untimed: 30 timed steps
MEMORY_EPOCHS = 2
MLP_HIDDEN = 2048  # peer_worker's MLP: 5.8 M parameters
WIDE_HIDDEN = 4096  # the same MLP twice as wide: 20.0 M parameters, 160 MB of Adam state
GOAL = 1.1  # the sharded step at most 1.1x the unsharded ring's at 2 processes, here
# The step's engines: "ring" = TensorFlow's collectives, "horovod" = Horovod's (Gloo) when
# installed (tfdist-run makes every job a Horovod job then).
ENGINES = ("ring", "horovod")


def _worker(out, strategy, epochs, sharded, mlp_hidden=MLP_HIDDEN):
    return ([sys.executable, WORKER, out, strategy, "--time", "--models", "mlp", "--epochs",
             str(epochs), "--optimizer", "adam", "--mlp-hidden", str(mlp_hidden)]
            + (["--shard-optimizer-state"] if sharded else []))


def _launch(tmp, tag, processes, epochs, sharded, strategy="ring", mlp_hidden=MLP_HIDDEN):
    """Every rank's `peer_worker` result of one tfdist-run job (`strategy`: "ring", the
    collectives, or "horovod", Horovod's engine on Gloo)."""
    out = os.path.join(tmp, f"{tag}.json")
    command = [sys.executable, "-m", "tfdist.launch", "-np", str(processes), "--timeout", "120",
               *_worker(out, strategy, epochs, sharded, mlp_hidden)]
    print("$", " ".join(command), flush=True)
    peer_report._run(command, env=peer_report._worker_env())  # pylint: disable=protected-access
    ranks = []
    for rank in range(processes):
        with open(out if rank == 0 else f"{out}.rank{rank}") as f:
            ranks.append(json.load(f)["models"]["mlp"])
    return ranks


def _floor(tmp, tag, processes):
    outs = [os.path.join(tmp, f"{tag}_{i}.json") for i in range(processes)]
    started = [fair_floor_process(i, _worker(out, "keras3", TIME_EPOCHS, False),
                                  peer_report._worker_env())  # pylint: disable=protected-access
               for i, out in enumerate(outs)]  # pinned, one intra-op thread: the fair floor
    procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for command, env in started]
    for proc in procs:
        output, _ = proc.communicate(timeout=peer_report.JOB_TIMEOUT_S)
        if proc.returncode != 0:
            raise peer_report.JobFailed(f"floor: exit code {proc.returncode}\n{output[-3000:]}")
    steps = []
    for out in outs:
        with open(out) as f:
            steps.append(json.load(f)["models"]["mlp"]["median_step_ms"])
    return statistics.median(steps)


def measure_memory(tmp, processes, mlp_hidden=MLP_HIDDEN):
    rows = []
    for p in processes:
        for sharded in (False, True):
            ranks = _launch(tmp, f"memory_{mlp_hidden}_P{p}_{'sharded' if sharded else 'ring'}",
                            p, MEMORY_EPOCHS, sharded, mlp_hidden=mlp_hidden)
            rows.append({
                "processes": p, "sharded": sharded, "mlp_hidden": mlp_hidden,
                "optimizer_mb_per_rank": [r["optimizer_bytes"] / 1e6 for r in ranks],
                "peak_rss_mb_per_rank": [round(r["peak_rss_mb"], 1) for r in ranks],
                "training_rss_mb_per_rank": [round(r["training_rss_mb"], 1) for r in ranks],
                "parameters": ranks[0]["parameters"]})
    return rows


def measure_steps(tmp, rounds, engines=ENGINES):
    configs = ("floor",) + tuple(f"{engine}{suffix}" for engine in engines
                                 for suffix in ("", "_sharded"))
    runs = {c: [] for c in configs}
    for round_ in range(rounds):
        for config in (configs if round_ % 2 == 0 else tuple(reversed(configs))):
            tag = f"time_r{round_}_{config}"
            if config == "floor":
                runs[config].append(_floor(tmp, tag, TIME_PROCESSES))
            else:
                ranks = _launch(tmp, tag, TIME_PROCESSES, TIME_EPOCHS,
                                config.endswith("_sharded"), config.split("_")[0])
                runs[config].append(ranks[0]["median_step_ms"])
    ratios = {}
    for engine in engines:
        prefix = "" if engine == "ring" else f"{engine}_"  # the ring's keys as before
        sharded, plain = runs[f"{engine}_sharded"], runs[engine]
        ratios[f"{prefix}sharded_over_{engine}"] = [s / r for s, r in zip(sharded, plain)]
        ratios[f"{engine}_over_floor"] = [r / f for r, f in zip(plain, runs["floor"])]
        ratios[f"{prefix}sharded_over_floor"] = [s / f for s, f in zip(sharded, runs["floor"])]
    return runs, ratios


def _memory_summary(memory):
    """Per row: the largest rank's optimizer MB, peak and training RSS (keys P<p>_<kind>_...,
    the wider MLP's prefixed with wide_)."""
    summary = {}
    for row in memory:
        prefix = ("wide_" if row["mlp_hidden"] != MLP_HIDDEN else "") + \
            f"P{row['processes']}_{'sharded' if row['sharded'] else 'ring'}"
        summary[f"{prefix}_optimizer_mb_max_rank"] = round(max(row["optimizer_mb_per_rank"]), 2)
        summary[f"{prefix}_peak_rss_mb_max_rank"] = max(row["peak_rss_mb_per_rank"])
        summary[f"{prefix}_training_rss_mb_max_rank"] = max(row["training_rss_mb_per_rank"])
    return summary


def run(tmp, rounds=ROUNDS, memory_processes=MEMORY_PROCESSES, name="optimizer_sharding"):
    start = time.perf_counter()
    memory = (measure_memory(tmp, memory_processes)
              + measure_memory(tmp, memory_processes, mlp_hidden=WIDE_HIDDEN))
    engines = ENGINES if importlib.util.find_spec("horovod") is not None else ("ring",)
    runs, ratios = measure_steps(tmp, rounds, engines)
    summary = _memory_summary(memory)
    summary.update({f"P{TIME_PROCESSES}_{key}": round(statistics.median(values), 3)
                    for key, values in ratios.items()})
    result = {
        "summary": summary, "memory": memory,
        "steps_ms": runs, "ratios_per_round": ratios, "rounds": rounds,
        "goal": f"optimizer bytes 1/P per rank; the sharded step <= {GOAL}x the unsharded "
                f"ring's at {TIME_PROCESSES} processes",
        "minutes": round((time.perf_counter() - start) / 60, 1),
        "description": (
            "784-2048-2048-10 MLP (5.8 M parameters), Adam(1e-3), 64 rows per process, one "
            "intra-op thread per process, all processes on one host (2 cores). memory: the "
            f"MLP and the same twice as wide (hidden {WIDE_HIDDEN}: 20.0 M parameters, 160 MB "
            "of Adam state; rows with mlp_hidden, summary keys wide_...), every "
            f"rank's optimizer variables, peak RSS and training RSS (RSS after {MEMORY_EPOCHS} "
            "epochs less RSS before the model was built) under "
            "tfdist-run, RingAllReduceStrategy(backend='collective') with and without "
            f"shard_optimizer_state=True. steps: median Keras step (epochs 2-{TIME_EPOCHS}) at "
            f"{TIME_PROCESSES} processes on each engine (ring = backend='collective', horovod "
            "= backend='horovod' on Gloo, each unsharded and _sharded); floor = {TIME_PROCESSES} plain Keras processes at "
            "once (no communication); ratios per round, medians over rounds, order "
            "alternating."),
    }
    write_result(f"{name}.json", result)
    plot(memory, f"{name}.png")
    print(f"optimizer_sharding: {result['minutes']} min", flush=True)
    return result


def plot(memory, filename):
    """Per process count: the largest rank's optimizer MB and peak RSS, unsharded and sharded."""
    plt = pyplot()
    if plt is None:
        return
    counts = sorted({row["processes"] for row in memory})
    widths = sorted({row["mlp_hidden"] for row in memory})
    fig, axes = plt.subplots(len(widths), 2, figsize=(9, 3.4 * len(widths)), squeeze=False)
    for axes_row, width in zip(axes, widths):
        rows = [row for row in memory if row["mlp_hidden"] == width]
        params = rows[0]["parameters"] / 1e6
        for ax, key, label in ((axes_row[0], "optimizer_mb_per_rank",
                                f"{params:.1f} M MLP: optimizer state (MB)"),
                               (axes_row[1], "training_rss_mb_per_rank",
                                f"{params:.1f} M MLP: training memory (MB)")):
            for offset, sharded in ((-0.2, False), (0.2, True)):
                values = [max(row[key]) for p in counts for row in rows
                          if row["processes"] == p and row["sharded"] == sharded]
                ax.bar([i + offset for i in range(len(values))], values, width=0.4,
                       label="shard_optimizer_state=True" if sharded else "unsharded",
                       color="tab:blue" if sharded else "tab:gray")
            ax.set_xticks(range(len(counts)), [f"P = {p}" for p in counts])
            ax.set_ylabel(label, fontsize=8)
            ax.legend(fontsize=8)
    fig.suptitle("Adam, TF ring: the largest rank's memory per process count")
    fig.tight_layout()
    save(fig, filename)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--memory-processes", type=int, nargs="+",
                        default=list(MEMORY_PROCESSES))
    parser.add_argument("--out", default="optimizer_sharding")
    parser.add_argument("--tmp", default=None)
    args = parser.parse_args()
    import tempfile  # pylint: disable=import-outside-toplevel

    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        run(tmp, args.rounds, tuple(args.memory_processes), args.out)


if __name__ == "__main__":
    main()
