"""`tfdist-bench --only parameter_sharding`: each rank's memory and the step of every placement.

`RingAllReduceStrategy(sharding=None | "optimizer" | "gradients" | "parameters")`
(ZeRO stages 0-3) on `benchmarks/peer_worker.py`'s MLP with Adam (16 bytes of
training state per parameter unsharded: parameters, gradients, two slots), as
processes of one plain `tfdist-run` job (Open MPI's engine where installed):

* memory at P = 1, 2 and 3 processes, the 784-4096-4096-10 MLP (20.0 M
  parameters: 80 MB of parameters, 160 MB of Adam state): every rank's peak
  resident memory over what it held before the model existed
  (`peak_training_rss_mb`: parameters, gradients, optimizer state, the step's
  buffers and gathered parameters), its optimizer bytes and its resident
  memory after training;
* the step at P = 2, the 784-2048-2048-10 MLP (5.8 M parameters, 64 rows per
  process): each placement in interleaved rounds (the order alternates), its
  median step over the same round's unsharded step.

Result: benchmarks/results/parameter_sharding.json and parameter_sharding.png.

    python -m benchmarks.parameter_sharding [--rounds 3] [--memory-processes 1 2 3]
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

from benchmarks import peer_report
from benchmarks.harness import HERE, write_result
from benchmarks.plotting import pyplot, save

WORKER = os.path.join(HERE, "peer_worker.py")
SHARDINGS = (None, "optimizer", "gradients", "parameters")
MEMORY_PROCESSES = (1, 2, 3)
MEMORY_HIDDEN = 4096
STEP_HIDDEN = 2048
STEP_PROCESSES = 2
ROUNDS = 3
GOAL = 1.3  # the issue's goal for stage 3's step against the unsharded one at 2 processes


def _label(sharding):
    return sharding or "unsharded"


def _launch(tmp, tag, processes, sharding, epochs, hidden):
    out = os.path.join(tmp, f"{tag}.json")
    command = [sys.executable, "-m", "tfdist.launch", "-np", str(processes), "--timeout", "300",
               sys.executable, WORKER, out, "auto", "--time", "--models", "mlp", "--epochs",
               str(epochs), "--optimizer", "adam", "--mlp-hidden", str(hidden)]
    if sharding is not None:
        command += ["--sharding", sharding]
    print("$", " ".join(command), flush=True)
    peer_report._run(command, env=peer_report._worker_env())  # pylint: disable=protected-access
    ranks = []
    for rank in range(processes):
        with open(out if rank == 0 else f"{out}.rank{rank}") as f:
            ranks.append(json.load(f)["models"]["mlp"])
    return ranks


def measure_memory(tmp, processes):
    rows = []
    for p in processes:
        for sharding in (SHARDINGS if p > 1 else (None,)):
            ranks = _launch(tmp, f"memory_P{p}_{_label(sharding)}", p, sharding, 2, MEMORY_HIDDEN)
            rows.append({
                "processes": p, "sharding": _label(sharding), "parameters": ranks[0]["parameters"],
                "peak_training_mb_per_rank": [round(r["peak_training_rss_mb"], 1) for r in ranks],
                "optimizer_mb_per_rank": [round(r["optimizer_bytes"] / 1e6, 2) for r in ranks],
                "resident_after_mb_per_rank": [round(r["training_rss_mb"], 1) for r in ranks]})
    return rows


def measure_steps(tmp, rounds):
    runs = {_label(s): [] for s in SHARDINGS}
    for round_ in range(rounds):
        order = SHARDINGS if round_ % 2 == 0 else tuple(reversed(SHARDINGS))
        for sharding in order:
            ranks = _launch(tmp, f"step_r{round_}_{_label(sharding)}", STEP_PROCESSES, sharding,
                            4, STEP_HIDDEN)
            runs[_label(sharding)].append(ranks[0]["median_step_ms"])
    ratios = {f"{name}_over_unsharded": [s / u for s, u in zip(steps, runs["unsharded"])]
              for name, steps in runs.items() if name != "unsharded"}
    return runs, ratios


def plot(memory, path):
    plt = pyplot()
    if plt is None:
        return None
    figure, axis = plt.subplots(figsize=(7, 4))
    for name in map(_label, SHARDINGS):
        rows = [r for r in memory if r["sharding"] == name or (r["processes"] == 1)]
        xs = [r["processes"] for r in rows]
        ys = [max(r["peak_training_mb_per_rank"]) for r in rows]
        axis.plot(xs, ys, marker="o", label=name)
    axis.set_xlabel("processes")
    axis.set_ylabel("peak training memory of the largest rank (MB)")
    axis.set_xticks(sorted({r["processes"] for r in memory}))
    axis.set_title("Adam on a 20 M-parameter MLP: each rank's peak over TensorFlow's own")
    axis.legend()
    return save(figure, path)  # under benchmarks/results/


def run(tmp, rounds=ROUNDS, memory_processes=MEMORY_PROCESSES):
    memory = measure_memory(tmp, memory_processes)
    runs, ratios = measure_steps(tmp, rounds)
    summary = {f"P{STEP_PROCESSES}_{name}_median": round(statistics.median(values), 3)
               for name, values in ratios.items()}
    for row in memory:
        summary[f"P{row['processes']}_{row['sharding']}_peak_training_mb_max_rank"] = \
            max(row["peak_training_mb_per_rank"])
    result = {"summary": summary, "memory": memory, "step_ms": runs,
              "ratios_per_round": ratios, "rounds": rounds,
              "goal": f"stage 3's step <= {GOAL}x the unsharded step at {STEP_PROCESSES} "
                      "processes; training memory about 1/P",
              "memory_model": f"784-{MEMORY_HIDDEN}-{MEMORY_HIDDEN}-10 MLP, Adam",
              "step_model": f"784-{STEP_HIDDEN}-{STEP_HIDDEN}-10 MLP, Adam, 64 rows a process"}
    write_result("parameter_sharding.json", result)
    plot(memory, "parameter_sharding.png")
    print(json.dumps(summary, indent=1))
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--memory-processes", type=int, nargs="+", default=list(MEMORY_PROCESSES))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        return run(tmp, args.rounds, tuple(args.memory_processes))


if __name__ == "__main__":
    main()
