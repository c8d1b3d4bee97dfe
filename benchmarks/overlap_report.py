"""`tfdist-bench --only overlap`: reverse-order gradient buckets on a bandwidth-bound model.

The `overlap_step.py` model (~19 MB of gradients, per-process batch 64,
one intra-op thread per process) on 2 processes for the ring on TF
collectives, the ring on Horovod and the tree, each with one bucket (the
gradients summed after the whole backward pass: no overlap), PyTorch DDP's
25 MiB buckets (first 1 MiB) and tfdist's default 4 MiB buckets (first
1 MiB); against one
process alone and two independent processes at once (the CPU contention of
two processes on this machine, without any communication). Rounds
interleave the configurations. Then one profiled run per strategy with one
bucket and with 4 MiB buckets (`tfdist-run --profile`): the share of the
communication time hidden behind computation, from the merged timeline.
Results: benchmarks/results/overlap_buckets.json and overlap_buckets.png.
"""

import json
import os
import statistics
import subprocess
import sys

from benchmarks.harness import HERE, launch, write_result
from benchmarks.plotting import pyplot, save
from tfdist.profiling.names import OVERLAP_FILE

ROUNDS = 2
MIB = 1 << 20
BUCKETS = {  # name: (bucket bytes, first bucket bytes)
    "one_bucket": (64 * MIB, 64 * MIB),
    "25MiB": (25 * MIB, MIB),
    "default_4MiB": (4 * MIB, MIB),
}
STRATEGIES = {"ring_collective": [], "ring_horovod": ["--horovod"], "tree": []}
PROFILED = ("one_bucket", "default_4MiB")


def _distributed(tmp, strategy, buckets, flags=()):
    out = os.path.join(tmp, f"overlap_{strategy}_{buckets}.json")
    launch(2, "overlap_step.py", [out, strategy, *BUCKETS[buckets]],
           flags=[*STRATEGIES[strategy], *flags])
    with open(out) as f:
        return json.load(f)["median_step_ms"]


def _alone(tmp, copies):
    """Median step ms of `copies` single-process trainings running at the same time."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TFDIST_", "HOROVOD_"))}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    outs = [os.path.join(tmp, f"alone{copies}_{i}.json") for i in range(copies)]
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "overlap_step.py"), out,
                               "alone", "0", "0"], env=env) for out in outs]
    if any(proc.wait() != 0 for proc in procs):
        raise SystemExit("overlap_step.py alone failed")
    times = []
    for out in outs:
        with open(out) as f:
            times.append(json.load(f)["median_step_ms"])
    return statistics.mean(times)


def _hidden_share(tmp, strategy, buckets):
    """Share of communication hidden behind computation in a profiled run (both ranks)."""
    log_dir = os.path.join(tmp, f"profile_{strategy}_{buckets}")
    _distributed(tmp, strategy, buckets, flags=["--profile", log_dir])
    with open(os.path.join(log_dir, OVERLAP_FILE)) as f:
        ranks = json.load(f)["ranks"]
    totals = [rank["total"] for rank in ranks.values()]
    return {"hidden_share": sum(t["hidden_ms"] for t in totals) / sum(t["comm_ms"] for t in totals),
            "phases_ms_rank0": ranks["0"]["phases_ms"]}


def run(tmp):
    samples = {"1_process": [], "2_independent": []}
    samples.update({f"{s}/{b}": [] for s in STRATEGIES for b in BUCKETS})
    for round_ in range(ROUNDS):
        samples["1_process"].append(_alone(tmp, 1))
        samples["2_independent"].append(_alone(tmp, 2))
        names = [(s, b) for s in STRATEGIES for b in BUCKETS]
        for strategy, buckets in (names if round_ % 2 == 0 else reversed(names)):
            samples[f"{strategy}/{buckets}"].append(_distributed(tmp, strategy, buckets))
    median = {name: statistics.median(times) for name, times in samples.items()}
    independent = median["2_independent"]
    profiles = {f"{s}/{b}": _hidden_share(tmp, s, b) for s in STRATEGIES if s != "ring_horovod"
                for b in PROFILED}
    summary = {name: round(ms / independent, 3) for name, ms in median.items()}
    result = {
        "summary": {"over_2_independent_processes": summary,
                    "hidden_share": {k: round(v["hidden_share"], 3) for k, v in profiles.items()}},
        "median_step_ms": median, "samples_ms": samples, "profiles": profiles,
        "description": "overlap_step.py model (19 MB of float32 gradients, conv layers first, "
                       "a 9216x512 dense layer near the output), per-process batch 64, one "
                       "intra-op thread per process, 2 processes; step time over two "
                       "independent single-process trainings at once; hidden_share: "
                       "communication time overlapped by computation in a profiled run "
                       "(tfdist-run --profile, merged timeline), both ranks. Horovod's own "
                       "ops are not in TensorFlow's profile, so its share is not measured.",
    }
    write_result("overlap_buckets.json", result)
    _plot(median)
    return result


def _plot(median):
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    width = 0.25
    for offset, (buckets, color) in enumerate(zip(BUCKETS, ("tab:gray", "tab:blue",
                                                            "tab:green"))):
        xs = [i + (offset - 1) * width for i in range(len(STRATEGIES))]
        ax.bar(xs, [median[f"{s}/{buckets}"] for s in STRATEGIES], width, color=color,
               label=buckets.replace("_", " "))
    for name, style in (("1_process", ":"), ("2_independent", "--")):
        ax.axhline(median[name], linestyle=style, color="black",
                   label=f"{name.replace('_', ' ')} ({median[name]:.0f} ms)")
    ax.axhline(1.15 * median["2_independent"], linestyle="-", color="tab:red", linewidth=0.8,
               label="goal: 1.15 x independent")
    ax.set_xticks(range(len(STRATEGIES)), list(STRATEGIES))
    ax.set_ylabel("median step (ms)")
    ax.set_ylim(0, 1.45 * max(median.values()))
    ax.set_title("19 MB of gradients, 2 processes: gradient buckets (loopback, 2 CPUs)")
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    fig.tight_layout()
    save(fig, "overlap_buckets.png")
