"""The asynchronous-PS experiment: sync, SSP (tau 1, 3, 8) and Downpour under stragglers.

For each optimizer (SGD with momentum, Adam) and each straggler scenario
(none, transient, persistent: see `async_ps.py`), every mode trains the same
model with 3 workers and 1 dedicated server; the chief's held-out loss is
recorded against wall time. Reported per run: the time to reach a target
loss (1.1 x the final loss of synchronous training without stragglers, per
optimizer), its ratio to synchronous training in the same scenario, the
final loss, and the staleness histogram of every worker's updates.

Writes benchmarks/results/async_ps.json, async_ps_loss.png and
async_ps_staleness.png. Usage: python -m benchmarks.async_report (or tfdist-bench --only async)
"""

import argparse
import json
import os
import tempfile

from benchmarks.harness import RESULTS, launch, write_result
from benchmarks.plotting import pyplot

WORKERS, SERVERS = 3, 1
MODES = {"sync": ("sync", "none"), "ssp_1": ("async", "1"), "ssp_3": ("async", "3"),
         "ssp_8": ("async", "8"), "async": ("async", "none")}
SCENARIOS = ("none", "transient", "persistent")
OPTIMIZERS = ("sgd", "adam")
TARGET_FACTOR = 1.1


def run_one(tmp, mode, scenario, optimizer):
    strategy_mode, staleness = MODES[mode]
    prefix = os.path.join(tmp, f"{mode}_{scenario}_{optimizer}")
    launch(WORKERS, "async_ps.py", [prefix, strategy_mode, staleness, scenario, optimizer],
           flags=("--num-servers", str(SERVERS)))
    ranks = []
    for rank in range(WORKERS):
        with open(f"{prefix}.rank{rank}.json") as f:
            ranks.append(json.load(f))
    return ranks


def time_to(curve, target):
    for seconds, loss in curve:
        if loss <= target:
            return seconds
    return None


def histogram(ranks):
    counts = [0] * 64
    for result in ranks:
        for index, count in enumerate((result["statistics"] or {}).get("staleness_counts",
                                                                       [0] * 64)):
            counts[index] += count
    last = max((i for i, c in enumerate(counts) if c), default=0)
    return counts[:last + 1]


def analyse(runs):
    rows = []
    for optimizer in OPTIMIZERS:
        reference = runs[(optimizer, "none", "sync")][0]["curve"][-1][1]
        target = TARGET_FACTOR * reference
        for scenario in SCENARIOS:
            sync_time = time_to(runs[(optimizer, scenario, "sync")][0]["curve"], target)
            for mode in MODES:
                ranks = runs[(optimizer, scenario, mode)]
                curve = ranks[0]["curve"]
                seconds = time_to(curve, target)
                rows.append({
                    "optimizer": optimizer, "scenario": scenario, "mode": mode,
                    "target_loss": target, "time_to_target_s": seconds,
                    "time_to_target_over_sync": (seconds / sync_time
                                                 if seconds and sync_time else None),
                    "final_loss": curve[-1][1], "wall_time_s": curve[-1][0],
                    "ms_per_step": 1000.0 * curve[-1][0] / max(ranks[0]["steps"] - 1, 1),
                    "staleness_histogram": histogram(ranks),
                    "staleness_max": max(((r["statistics"] or {}).get("staleness_max", 0)
                                          for r in ranks)),
                    "ps_wait_ms_mean": sum(((r["statistics"] or {}).get("ps_wait_ms", 0.0)
                                            for r in ranks)) / len(ranks),
                })
    return rows


def plot(runs, rows):
    plt = pyplot()
    if plt is None:
        return
    colors = {"sync": "black", "ssp_1": "tab:blue", "ssp_3": "tab:green", "ssp_8": "tab:orange",
              "async": "tab:red"}
    fig, axes = plt.subplots(len(OPTIMIZERS), len(SCENARIOS), figsize=(13, 7), sharey="row")
    for i, optimizer in enumerate(OPTIMIZERS):
        target = next(r["target_loss"] for r in rows if r["optimizer"] == optimizer)
        for j, scenario in enumerate(SCENARIOS):
            ax = axes[i][j]
            for mode, color in colors.items():
                curve = runs[(optimizer, scenario, mode)][0]["curve"]
                ax.plot([c[0] for c in curve], [c[1] for c in curve], color=color, label=mode)
            ax.axhline(target, color="gray", linestyle=":", linewidth=1)
            ax.set_title(f"{optimizer}, stragglers: {scenario}")
            ax.set_xlabel("wall time (s)")
            if j == 0:
                ax.set_ylabel("held-out loss (chief)")
            ax.set_yscale("log")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "async_ps_loss.png"), dpi=110)
    fig, axes = plt.subplots(1, len(SCENARIOS), figsize=(13, 3.5), sharey=True)
    for ax, scenario in zip(axes, SCENARIOS):
        for mode in ("ssp_1", "ssp_3", "ssp_8", "async"):
            row = next(r for r in rows if r["optimizer"] == "sgd" and r["scenario"] == scenario
                       and r["mode"] == mode)
            counts = row["staleness_histogram"]
            total = max(sum(counts), 1)
            ax.plot(range(len(counts)), [c / total for c in counts], "o-", color=colors[mode],
                    label=mode, markersize=3)
        ax.set_title(f"staleness of updates (sgd), stragglers: {scenario}")
        ax.set_xlabel("staleness (steps)")
    axes[0].set_ylabel("share of updates")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "async_ps_staleness.png"), dpi=110)


def run(tmp):
    runs = {}
    for optimizer in OPTIMIZERS:
        for scenario in SCENARIOS:
            for mode in MODES:
                runs[(optimizer, scenario, mode)] = run_one(tmp, mode, scenario, optimizer)
    rows = analyse(runs)
    summary = {f"{r['optimizer']}/{r['scenario']}/{r['mode']}": r["time_to_target_over_sync"]
               for r in rows}
    result = write_result("async_ps.json", {
        "description": (
            f"{WORKERS} workers, {SERVERS} dedicated server; simulated device steps of "
            "COMPUTE_SECONDS with stragglers (benchmarks/async_ps.py); held-out loss of the "
            "chief's parameters against wall time from the end of its first (compiled) step; "
            f"ms_per_step: the chief's; target = {TARGET_FACTOR} x the final loss "
            "of sync without stragglers; summary = time to target / sync's in the same "
            "scenario (None: target not reached)."),
        "summary": summary, "rows": rows,
        "curves": {"/".join(key): ranks[0]["curve"] for key, ranks in runs.items()}})
    plot(runs, rows)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.async_report")
    parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        run(tmp)


if __name__ == "__main__":
    main()
