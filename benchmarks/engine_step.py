"""`tfdist-bench --only engine_step`: a big and a small model's training step per engine vs the floor.

What a step costs on each engine tfdist can use, against the no-communication
floor: P independent plain-Keras processes started at once, each at the same
per-process batch - the same CPU contention, no gradient exchange. Models
(`peer_worker.py`, the peer benchmark's worker, SGD with momentum, one intra-op
thread per process; median Keras step of the epochs after the first): the
784-2048-2048-10 MLP (5.8 M parameters, 23 MB of gradients, 64 rows per process)
and the digits CNN (global batch 64: 64 / P rows per process, which each floor
process trains alone). Configurations:

* floor         P x `peer_worker.py keras3`, no tfdist, no communication, started
                as tfdist-run starts its ranks: each pinned to its own core with
                one intra-op thread (`harness.fair_floor_process`, the fair floor);
* ring          `RingAllReduceStrategy(backend="collective")`, default buckets
                (TensorFlow's collectives over gRPC), under tfdist-run;
* ring_big      the same with 32 MiB buckets: one fused all-reduce of the whole
                23 MB gradient, which the communicator subdivides (16 pieces
                per device from 16 MiB, see `tfdist.comm.tf_collective`);
* horovod_gloo  `backend="horovod"` under tfdist-run (Gloo, TCP);
* horovod_mpi   `backend="horovod"` under Open MPI's mpirun (shared memory);
* mpi           `backend="mpi"` under Open MPI's mpirun: Open MPI's own collectives
                from compiled ops on the tensors' buffers (`tfdist.comm.mpi`);
* auto          `RingAllReduceStrategy()` under plain `tfdist-run`: the engine a
                user's script gets (tfdist-run starts its ranks as one MPI job when
                Open MPI is installed, and "auto" takes the fastest engine there);
* *_sharded     the same with `shard_optimizer_state=True` (ZeRO stage 1: the
                parameters' all-gather after the update; ring, horovod_gloo, mpi, auto);
* mwms          tf-keras + `MultiWorkerMirroredStrategy` (the peer benchmark's
                environment), the baseline users have.

An engine that is not available here (no Horovod, no mpirun, no tf-keras
peer) is skipped and named. Rounds alternate the order; every ratio is a
configuration's step over the floor's of the same round, then the median
over rounds. Result: benchmarks/results/engine_step.json and engine_step.png.

    python -m benchmarks.engine_step [--processes 2 4] [--rounds 3] [--configs C ...]
                                     [--models mlp cnn] [--peer-python PY] [--out NAME]
"""

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from benchmarks import peer_report
from benchmarks.harness import (HERE, fair_floor_process, mpirun_available, mpirun_command,
                                open_mpi_env, write_result)
from benchmarks.plotting import pyplot, save

WORKER = os.path.join(HERE, "peer_worker.py")
CONFIGS = ("floor", "ring", "ring_big", "ring_sharded", "horovod_gloo", "horovod_gloo_sharded",
           "horovod_mpi", "mpi", "mpi_sharded", "auto", "auto_sharded", "mwms")
BIG_BUCKET_MB = 32
ROUNDS = 3
PROCESSES = (2,)
MODELS = ("mlp", "cnn")
GOAL = {"mlp": 1.25, "cnn": 1.3}  # the default engine's 2-process step over the floor (issue 65)
CNN_GLOBAL_BATCH = 64
EPOCHS = 4  # the first untimed: 30 timed steps per run
DESCRIPTION = (
    "median Keras step (epochs 2-4) of the 784-2048-2048-10 MLP (mlp: 5.8 M "
    "parameters, 23 MB of float32 gradients, 64 rows per process, 30 steps) and the "
    "digits CNN (cnn: global batch 64, 66 steps), SGD(0.05, momentum=0.9), one "
    "intra-op thread per process, all processes on one host. "
    "floor = P independent plain Keras processes started together (no "
    "communication), each at the per-process batch (cnn: 64 / P rows), each pinned to "
    "its own core with one intra-op thread, as tfdist-run starts its ranks (the fair "
    "floor); mpi = "
    "backend='mpi' under mpirun (Open MPI's collectives from compiled ops); "
    "ring = RingAllReduceStrategy(backend='collective') default "
    f"buckets; ring_big = {BIG_BUCKET_MB} MiB buckets (one fused all-reduce, "
    "subdivided); horovod_gloo / horovod_mpi = backend='horovod' under tfdist-run / "
    "mpirun; auto = RingAllReduceStrategy() under plain tfdist-run (the engine "
    "'auto' takes there: 'backend' per run); *_sharded = the same with "
    "shard_optimizer_state=True; mwms = tf-keras + MultiWorkerMirroredStrategy. "
    "over_floor: per-round ratio to the floor of the same round, median over "
    "rounds; rounds alternate the order.")


def _worker(python, out, strategy, models, *options):
    return [python, WORKER, out, strategy, "--time", "--models", *models, "--epochs",
            str(EPOCHS), *options]


def _env():
    return peer_report._worker_env()  # pylint: disable=protected-access


def _floor(tmp, processes, tag, models):
    """P plain processes at once, each at a P-process job's per-process batch; per model, the
    median of their median steps."""
    outs = [os.path.join(tmp, f"floor_{tag}_{i}.json") for i in range(processes)]
    batch = ["--cnn-batch", str(CNN_GLOBAL_BATCH // processes)]
    started = [fair_floor_process(i, _worker(sys.executable, out, "keras3", models, *batch),
                                  _env()) for i, out in enumerate(outs)]
    procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for command, env in started]
    for proc in procs:
        output, _ = proc.communicate(timeout=peer_report.JOB_TIMEOUT_S)
        if proc.returncode != 0:
            raise peer_report.JobFailed(f"floor process: exit code {proc.returncode}\n"
                                        f"{output[-3000:]}")
    results = []
    for out in outs:
        with open(out) as f:
            results.append(json.load(f)["models"])
    return {model: {"median_step_ms": statistics.median(r[model]["median_step_ms"]
                                                        for r in results),
                    "wall_ms_per_step": statistics.median(r[model]["wall_ms_per_step"]
                                                          for r in results),
                    "per_process_ms": [r[model]["median_step_ms"] for r in results]}
            for model in models}


def _distributed(tmp, config, processes, tag, peer_python, models):
    out = os.path.join(tmp, f"{config}_{tag}.json")
    if config == "mwms":
        peer_report.launch_mwms(peer_python, processes, out,
                                ["--time", "--models", *models, "--epochs", str(EPOCHS)])
    else:
        options = ["--bucket-mb", str(BIG_BUCKET_MB)] if config == "ring_big" else []
        if config.endswith("_sharded"):
            options.append("--shard-optimizer-state")
            config = config[:-len("_sharded")]
        strategy = ("ring" if config.startswith("ring") else
                    config if config in ("auto", "mpi") else "horovod")
        worker = _worker(sys.executable, out, strategy, models, *options)
        if config in ("horovod_mpi", "mpi"):
            command = mpirun_command(processes) + worker
            env = dict(_env(), **open_mpi_env())
        else:
            flags = ["--horovod"] if config == "horovod_gloo" else []
            command = [sys.executable, "-m", "tfdist.launch", "-np", str(processes),
                       "--timeout", "120", *flags, *worker]
            env = _env()
        print("$", " ".join(command), flush=True)
        peer_report._run(command, env=env)  # pylint: disable=protected-access
    with open(out) as f:
        everything = json.load(f)
    return {model: {"median_step_ms": result["median_step_ms"],
                    "wall_ms_per_step": result.get("wall_ms_per_step"),
                    "parameters": result["parameters"], "backend": everything.get("backend")}
            for model, result in everything["models"].items()}


def available_configs(peer_python):
    """{config: None if it can run here, else why not}."""
    why = dict.fromkeys(CONFIGS)
    if importlib.util.find_spec("horovod") is None:
        why["horovod_gloo"] = why["horovod_gloo_sharded"] = why["horovod_mpi"] = (
            "Horovod is not installed")
    if why["horovod_mpi"] is None and not mpirun_available():
        why["horovod_mpi"] = "no mpirun or no Horovod built with MPI"
    if shutil.which("mpirun") is None:
        why["mpi"] = why["mpi_sharded"] = "no mpirun"
    else:
        from tfdist.comm import mpi  # pylint: disable=import-outside-toplevel

        reason = mpi.unavailable_reason()
        if reason:
            why["mpi"] = why["mpi_sharded"] = reason
    if peer_python is None:
        why["mwms"] = "no tf-keras peer environment"
    return why


def run(tmp, rounds=ROUNDS, processes=PROCESSES, peer_python="auto", name="engine_step",
        only=None, models=MODELS, write=True):
    start = time.perf_counter()
    if peer_python == "auto":
        try:
            peer_python = peer_report.peer_python()
        except peer_report.JobFailed as error:
            print(f"engine_step: mwms skipped: {error}", flush=True)
            peer_python = None
    skipped = {k: v for k, v in available_configs(peer_python).items() if v}
    configs = [c for c in CONFIGS if c not in skipped and (only is None or c in only
                                                            or c == "floor")]
    for config, why in skipped.items():
        print(f"engine_step: {config} skipped - {why}", flush=True)
    runs = {(c, p): [] for c in configs for p in processes}
    for round_ in range(rounds):
        order = configs if round_ % 2 == 0 else list(reversed(configs))
        for p in processes:
            for config in order:
                tag = f"r{round_}_P{p}"
                runs[config, p].append(
                    _floor(tmp, p, tag, models) if config == "floor"
                    else _distributed(tmp, config, p, tag, peer_python, models))
    rows, summary = [], {}
    for p in processes:
        for model in models:
            floor = [r[model] for r in runs["floor", p]]
            for config in configs:
                mine = [r[model] for r in runs[config, p]]
                ratios = [r["median_step_ms"] / f["median_step_ms"] for r, f in zip(mine, floor)]
                walls = [r["wall_ms_per_step"] / f["wall_ms_per_step"] for r, f in zip(mine, floor)
                         if r.get("wall_ms_per_step") and f.get("wall_ms_per_step")]
                row = {"config": config, "processes": p, "model": model,
                       "wall_over_floor_per_round": walls,
                       "wall_over_floor": statistics.median(walls) if walls else None,
                       "median_step_ms": statistics.median(r["median_step_ms"] for r in mine),
                       "over_floor_per_round": ratios, "over_floor": statistics.median(ratios),
                       "backend": mine[0].get("backend")}
                if "mwms" in configs and config != "mwms":
                    row["over_mwms"] = statistics.median(
                        r["median_step_ms"] / m[model]["median_step_ms"]
                        for r, m in zip(mine, runs["mwms", p]))
                rows.append(row)
                summary[f"P{p}_{model}_{config}_over_floor"] = round(row["over_floor"], 3)
                if "over_mwms" in row:
                    summary[f"P{p}_{model}_{config}_over_mwms"] = round(row["over_mwms"], 3)
            engines = [r for r in rows if r["processes"] == p and r["model"] == model
                       and r["config"] not in ("floor", "mwms")]
            fastest = min(engines, key=lambda r: r["over_floor"])
            summary[f"P{p}_{model}_fastest_engine"] = fastest["config"]
    result = {
        "summary": summary, "rows": rows, "skipped": skipped, "rounds": rounds,
        "goal": {model: f"the default engine's 2-process step <= {GOAL[model]}x the floor"
                 for model in models},
        "runs": {f"{c}_P{p}": r for (c, p), r in runs.items()},
        "minutes": round((time.perf_counter() - start) / 60, 1),
        "description": DESCRIPTION,
    }
    if write:
        write_result(f"{name}.json", result)
        plot(rows, f"{name}.png")
    print(f"engine_step: {result['minutes']} min", flush=True)
    return result


def plot(rows, filename, goal=GOAL):
    """Per model and process count: each configuration's step over the floor, per round and
    median."""
    plt = pyplot()
    if plt is None:
        return
    panels = sorted({(r["model"], r["processes"]) for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.8), squeeze=False)
    for ax, (model, p) in zip(axes[0], panels):
        mine = [r for r in rows if r["processes"] == p and r["model"] == model]
        for index, row in enumerate(mine):
            ax.bar(index, row["over_floor"], color="tab:gray" if row["config"] in (
                "floor", "mwms") else "tab:blue")
            ax.plot([index] * len(row["over_floor_per_round"]), row["over_floor_per_round"],
                    "k.", markersize=4)
        ax.axhline(goal[model], color="tab:red", linestyle="--", linewidth=1,
                   label=f"goal {goal[model]}x")
        ax.set_xticks(range(len(mine)), [r["config"] for r in mine], rotation=30, ha="right")
        ax.set_ylabel("step / no-communication floor")
        ax.set_title(f"{'5.8 M MLP' if model == 'mlp' else 'digits CNN'}, {p} processes")
        ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, filename)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=list(PROCESSES))
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--peer-python", default="auto",
                        help="a Python with tf-keras on this TensorFlow for the mwms runs "
                             "(default: the peer benchmark's environment); 'none' skips them")
    parser.add_argument("--out", default="engine_step", help="result file name, no suffix")
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=None,
                        help="only these configurations (and the floor); default: all")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--tmp", default=None)
    args = parser.parse_args()
    peer = None if args.peer_python == "none" else args.peer_python
    import tempfile  # pylint: disable=import-outside-toplevel

    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        run(tmp, args.rounds, tuple(args.processes), peer, args.out, args.configs,
            tuple(args.models))


if __name__ == "__main__":
    main()
