"""`tfdist-bench --only default_step`: where plain `tfdist-run -np 2`'s step goes, against the fair floor.

The step a user gets by default - `RingAllReduceStrategy()` under plain
`tfdist-run -np 2`, which runs on Open MPI's engine - for the digits CNN
(global batch 64) and the 5.8 M parameter MLP (64 rows per process), against
the fair floor: two independent plain-Keras processes started as tfdist-run
starts its ranks (each pinned to its own core with one intra-op thread,
`harness.fair_floor_process`) at the per-process batch.

* Timing: `engine_step`'s interleaved rounds of floor, auto (plain
  tfdist-run), mpi (`backend="mpi"` under plain `mpirun`) and mwms (tf-keras +
  MultiWorkerMirroredStrategy, the users' alternative, where its environment
  exists); each configuration's median step over the floor's of the same
  round, then the median over rounds.
* Anatomy: one more plain tfdist-run job after the rounds, with tfdist's
  communication counters on (`peer_worker.py --anatomy`; not compared with
  the floor: the counters' timestamps cost a little): per model, every
  collective the traced step issues (name scope, count, bytes), their time
  per step and this rank's wait for the slower one, the train function's
  median call and the Python around it (Keras' loop and the callbacks: the
  step minus the function).

Result: benchmarks/results/default_step.json and default_step.png.

    python -m benchmarks.default_step [--rounds 3] [--peer-python PY|none]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks import engine_step, peer_report
from benchmarks.harness import write_result
from benchmarks.plotting import pyplot, save

MODELS = ("cnn", "mlp")
GOAL = 1.2  # plain tfdist-run -np 2 over the fair floor, both models
CONFIGS = ("auto", "mpi", "mwms")


def anatomy(tmp, models=MODELS):
    """Per model, the anatomy of plain tfdist-run -np 2's step (see the module docstring)."""
    out = os.path.join(tmp, "anatomy.json")
    command = [sys.executable, "-m", "tfdist.launch", "-np", "2", "--timeout", "120",
               sys.executable, engine_step.WORKER, out, "auto", "--time", "--anatomy",
               "--models", *models, "--epochs", str(engine_step.EPOCHS)]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, env=peer_report._worker_env(), check=True)  # pylint: disable=W0212
    with open(out) as f:
        everything = json.load(f)
    return {model: dict(result["anatomy"], median_step_ms=result["median_step_ms"],
                        backend=everything.get("backend"))
            for model, result in everything["models"].items()}


def plot(rows, parts, filename):
    """Left: each configuration's step over the fair floor; right: the default step's parts."""
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, model in zip(axes[:2], MODELS):
        mine = [r for r in rows if r["model"] == model]
        for index, row in enumerate(mine):
            ax.bar(index, row["over_floor"], color="tab:gray" if row["config"] in (
                "floor", "mwms") else "tab:blue")
            ax.plot([index] * len(row["over_floor_per_round"]), row["over_floor_per_round"],
                    "k.", markersize=4)
        ax.axhline(GOAL, color="tab:red", linestyle="--", linewidth=1, label=f"goal {GOAL}x")
        ax.set_xticks(range(len(mine)), [r["config"] for r in mine], rotation=30, ha="right")
        ax.set_ylabel("step / fair floor")
        ax.set_title("digits CNN" if model == "cnn" else "5.8 M MLP")
        ax.legend(fontsize=8)
    ax = axes[2]
    for index, model in enumerate(MODELS):
        part = parts[model]
        bottom = 0.0
        for name, value, color in (("floor step", part["floor_ms"], "tab:gray"),):
            ax.bar(index - 0.2, value, width=0.35, color=color, label=name if index == 0 else None)
        for name, value, color in (("communication", part["communication_ms"], "tab:orange"),
                                   ("rest of the train function", part["function_rest_ms"],
                                    "tab:blue"),
                                   ("Python around it", part["python_ms"], "tab:green")):
            ax.bar(index + 0.2, value, width=0.35, bottom=bottom, color=color,
                   label=name if index == 0 else None)
            bottom += value
    ax.set_xticks(range(len(MODELS)), ["digits CNN", "5.8 M MLP"])
    ax.set_ylabel("ms per step (rank 0)")
    ax.set_title("tfdist-run -np 2's step, in parts")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, filename)


def run(tmp, rounds=engine_step.ROUNDS, peer_python="auto", name="default_step"):
    timing = engine_step.run(tmp, rounds, (2,), peer_python, name=f"{name}_rounds",
                             only=CONFIGS, models=MODELS, write=False)
    parts_of = anatomy(tmp)
    rows = timing["rows"]
    summary, parts = {}, {}
    for model in MODELS:
        floor = next(r for r in rows if r["model"] == model and r["config"] == "floor")
        for row in rows:
            if row["model"] == model and row["config"] != "floor":
                summary[f"{model}_{row['config']}_over_floor"] = round(row["over_floor"], 3)
                if "over_mwms" in row:
                    summary[f"{model}_{row['config']}_over_mwms"] = round(row["over_mwms"], 3)
        anatomy_of = parts_of[model]
        communication = anatomy_of["communication"].get("comm_ms", 0.0)
        parts[model] = {
            "floor_ms": floor["median_step_ms"],
            "communication_ms": communication,
            "function_rest_ms": max(anatomy_of["median_function_ms"] - communication, 0.0),
            "python_ms": max(anatomy_of["median_python_ms"], 0.0),
        }
        summary[f"{model}_collectives_per_step"] = round(anatomy_of["collectives_per_step"], 2)
    result = {
        "summary": summary, "goal": f"plain tfdist-run -np 2 <= {GOAL}x the fair floor",
        "rows": rows, "anatomy": parts_of, "parts_ms": parts, "skipped": timing["skipped"],
        "rounds": rounds, "runs": timing["runs"], "minutes": timing["minutes"],
        "description": engine_step.DESCRIPTION + (
            " Anatomy: one plain tfdist-run -np 2 job with the communication counters on: "
            "traced_collectives = every collective the traced train step issues (name scope, "
            "count, payload bytes each); communication = the counters' per-step time in "
            "collectives (comm_ms), this rank's wait for the slower one (wait_ms); "
            "median_function_ms = the train function's median call; median_python_ms = the "
            "median step (batch begin to end) minus it."),
    }
    write_result(f"{name}.json", result)
    plot(rows, parts, f"{name}.png")
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=engine_step.ROUNDS)
    parser.add_argument("--peer-python", default="auto",
                        help="a Python with tf-keras for the mwms runs; 'none' skips them")
    parser.add_argument("--out", default="default_step")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run(tmp, args.rounds, None if args.peer_python == "none" else args.peer_python,
            args.out)


if __name__ == "__main__":
    main()
