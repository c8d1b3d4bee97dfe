"""The large-batch experiment: does the learning-rate recipe keep accuracy at 8B and 32B?

Trains the task of `task.py` for the same number of epochs at batch B, 8B
and 32B with (a) the base rate tuned at B, (b) the linear scaling rule,
(c) linear scaling + gradual warmup from the base rate (Goyal et al. 2017),
(d) LARS with linear scaling + warmup (You et al. 2017), and reports the
final validation accuracy and its gap to the batch-B baseline. At batch B,
(b) and (c) are (a) by construction (k = 1), so (a) is run once. The 8B
recipe (c) is run again across 2 processes (tfdist-run, same global batch),
which must give the same accuracy.

    python -m benchmarks.large_batch          # or: tfdist-bench --only large_batch

Writes benchmarks/results/large_batch.json, large_batch.md (the table) and
large_batch.png (validation accuracy and learning rate per epoch).
"""

import datetime
import json
import os
import subprocess
import sys
import tempfile

from benchmarks.plotting import RESULTS, pyplot

BASE_BATCH = 32
MULTIPLES = (1, 8, 32)
METHODS = {"base": "(a) base rate", "linear": "(b) linear scaling",
           "warmup": "(c) linear + warmup", "lars": "(d) LARS + linear + warmup"}
SETTINGS = {"epochs": 10, "sgd_lr": 0.01, "lars_lr": 0.3, "warmup_epochs": 2, "seed": 0}
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def train_once(tmp, batch, method, processes=1):
    out = os.path.join(tmp, f"{method}_{batch}_{processes}.json")
    worker = ["-m", "benchmarks.large_batch.train", out, "--batch", str(batch), "--method", method,
              "--base-batch", str(BASE_BATCH)] + [
        f"--{name.replace('_', '-')}={value}" for name, value in SETTINGS.items()]
    launcher = [sys.executable, "-m", "tfdist.launch", "-np", str(processes)] if processes > 1 \
        else []
    command = launcher + [sys.executable] + worker
    print("$", " ".join(command[1:] if processes > 1 else command[2:]), flush=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run(command, env=env, cwd=REPO, check=True)
    with open(out) as f:
        row = json.load(f)
    row["val_accuracy"] = row["history"]["val_accuracy"][-1]
    return row


def table(rows):
    """Markdown table: final validation accuracy and gap to the batch-B baseline."""
    baseline = next(r for r in rows if r["batch"] == BASE_BATCH and r["method"] == "base")
    lines = ["| global batch | method | processes | final val. accuracy | gap to B (pp) | time (s) |",
             "|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        gap = 100 * (r["val_accuracy"] - baseline["val_accuracy"])
        lines.append(f"| {r['batch']} ({r['batch'] // BASE_BATCH}B) | {METHODS[r['method']]} | "
                     f"{r['processes']} | {100 * r['val_accuracy']:.2f}% | {gap:+.2f} | "
                     f"{r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def plot(rows, path):
    plt = pyplot()
    if plt is None:
        return
    colors = {"base": "tab:gray", "linear": "tab:blue", "warmup": "tab:green", "lars": "tab:red"}
    fig, axes = plt.subplots(2, len(MULTIPLES), figsize=(13, 7), sharex=True)
    baseline = next(r for r in rows if r["batch"] == BASE_BATCH and r["method"] == "base")
    for column, k in enumerate(MULTIPLES):
        accuracy, rate = axes[0][column], axes[1][column]
        for r in rows:
            if r["batch"] != k * BASE_BATCH or r["processes"] != 1:
                continue
            epochs = range(1, len(r["history"]["val_accuracy"]) + 1)
            label = METHODS[r["method"]] if k > 1 else "(a) = (b) = (c) at k = 1" \
                if r["method"] == "base" else METHODS[r["method"]]
            accuracy.plot(epochs, [100 * a for a in r["history"]["val_accuracy"]], marker="o",
                          markersize=3, color=colors[r["method"]], label=label)
            rate.plot(epochs, r["history"]["learning_rate"], marker="o", markersize=3,
                      color=colors[r["method"]])
        accuracy.axhline(100 * baseline["val_accuracy"], color="black", linestyle=":",
                         linewidth=1, label="batch B baseline (final)")
        accuracy.set_title(f"global batch {k * BASE_BATCH} ({k}B)")
        accuracy.set_ylim(40, 90)
        accuracy.grid(alpha=0.3)
        rate.set_yscale("log")
        rate.set_xlabel("epoch")
        rate.grid(alpha=0.3, which="both")
        accuracy.legend(fontsize=7, loc="lower right")
    axes[0][0].set_ylabel("validation accuracy (%)")
    axes[1][0].set_ylabel("learning rate at epoch end")
    fig.suptitle("Same epochs, larger batches: 10-class generated task (60k examples), MLP")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}", flush=True)


def run(tmp):
    rows = []
    for k in MULTIPLES:
        for method in METHODS:
            if k == 1 and method in ("linear", "warmup"):
                continue  # identical to the base rate at k = 1
            rows.append(train_once(tmp, k * BASE_BATCH, method))
    rows.append(train_once(tmp, 8 * BASE_BATCH, "warmup", processes=2))
    baseline = rows[0]["val_accuracy"]
    summary = {f"{r['method']}_{r['batch'] // BASE_BATCH}B_{r['processes']}p_gap_pp":
               round(100 * (r["val_accuracy"] - baseline), 2) for r in rows}
    summary["baseline_val_accuracy"] = baseline
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": dict(SETTINGS, base_batch=BASE_BATCH, momentum=0.9,
                         lars_trust_coefficient=0.001),
        "summary": summary, "rows": rows,
        "description": __doc__.split("\n\n")[1].replace("\n", " "),
    }
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "large_batch.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(RESULTS, "large_batch.md"), "w") as f:
        f.write(table(rows))
    plot(rows, os.path.join(RESULTS, "large_batch.png"))
    print(table(rows), flush=True)
    return result


def main():
    with tempfile.TemporaryDirectory() as tmp:
        run(tmp)


if __name__ == "__main__":
    main()
