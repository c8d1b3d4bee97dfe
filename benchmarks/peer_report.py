"""`tfdist-bench --only peer`: tfdist against what users would pick instead, tf-keras + MWMS.

The peer is Keras 2 (`tf-keras`, `TF_USE_LEGACY_KERAS=1`) with TensorFlow's
`MultiWorkerMirroredStrategy`: one process per worker, a "worker" job in
`TF_CONFIG` on localhost. It lives in its own virtual environment,
`benchmarks/.peer-venv` (the TensorFlow version of this one, tf-keras of the
same minor), created here once and reused while it imports.

One worker script (`peer_worker.py`) trains the same models on the same data
with the same optimizer, global batch and step count under either framework:
(a) the digits demo's CNN (8x8x1 inputs, global batch 64) and (b) an MLP of
5.8 M parameters (64 rows per process), on 2 and 3 processes. Rounds are
interleaved (tfdist ring, MWMS, tfdist tree, tfdist co-located parameter
server; reversed every other round) and each tfdist run is compared with the
MWMS run of the same round: paired ratios tfdist / MWMS of the median step
and of the time per epoch, their median over rounds and the number of
rounds tfdist was faster. Correctness: in the first round every job also
trains both models on 100 samples (last global batch 36, uneven slices on 3
processes) from one saved set of initial weights; rank 0's weights are
compared with one plain process of the same framework.
Result: benchmarks/results/peer.json and peer_step_ratio.png.
"""

import importlib.metadata
import json
import os
import signal
import statistics
import subprocess
import sys
import time

from benchmarks.harness import HERE, per_round_ratios, write_result
from benchmarks.plotting import pyplot, save

PEER_VENV = os.path.join(HERE, ".peer-venv")
WORKER = os.path.join(HERE, "peer_worker.py")
ROUNDS = 5
PROCESSES = (2, 3)
MODELS = ("cnn", "mlp")
OUR_STRATEGIES = ("ring", "tree", "ps")
ORDER = ("ring", "mwms", "tree", "ps")
GOAL = 0.9  # tfdist's step at most 0.9x the peer's
JOB_TIMEOUT_S = 420
INSTALL_TIMEOUT_S = 1800
TAIL_CHARS = 3000


class JobFailed(RuntimeError):
    """A benchmark subprocess exited non-zero or ran past its timeout."""


def tensorflow_distribution():
    """(distribution name, version) of this environment's TensorFlow, e.g. tensorflow-cpu."""
    for distribution in ("tensorflow-cpu", "tensorflow"):
        try:
            return distribution, importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise JobFailed("TensorFlow is not installed in this environment")


def peer_requirements():
    """pip requirements of the peer environment: this TensorFlow, tf-keras of its minor."""
    distribution, version = tensorflow_distribution()
    major, minor = version.split(".")[:2]
    return f"{distribution}=={version}", f"tf-keras=={major}.{minor}.*"


# Prints the TensorFlow version and every installed distribution named tensorflow*: the peer
# must run the very build this environment runs (tf-keras alone would pull in `tensorflow`).
_PEER_CHECK = ("import importlib.metadata as m, tensorflow, tf_keras; "
               "names = {d.metadata['Name'].lower().replace('_', '-') for d in m.distributions()}; "
               "print(tensorflow.__version__, *sorted(n for n in names "
               "if n.startswith('tensorflow')))")


def peer_python():
    """The peer environment's Python, created (once) unless it already imports tf_keras
    on this environment's TensorFlow build."""
    python = os.path.join(PEER_VENV, "bin", "python")
    distribution, version = tensorflow_distribution()
    expected = f"{version} {distribution}"
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3")
    if os.path.exists(python):
        done = subprocess.run([python, "-c", _PEER_CHECK], env=env, capture_output=True,
                              text=True, timeout=300)
        if done.returncode == 0 and done.stdout.strip() == expected:
            return python
    tensorflow_requirement, tf_keras_requirement = peer_requirements()
    print(f"creating {PEER_VENV}: pip install {tensorflow_requirement}, then "
          f"{tf_keras_requirement} --no-deps (once; minutes)", flush=True)
    try:
        _run([sys.executable, "-m", "venv", "--clear", PEER_VENV], timeout=300)
        _run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
             timeout=INSTALL_TIMEOUT_S)
        _run([python, "-m", "pip", "install", "--quiet", tensorflow_requirement],
             timeout=INSTALL_TIMEOUT_S)
        _run([python, "-m", "pip", "install", "--quiet", "--no-deps", tf_keras_requirement],
             timeout=INSTALL_TIMEOUT_S)
        output, _ = _run([python, "-c", _PEER_CHECK], env=env, timeout=300)
    except JobFailed as error:
        raise JobFailed(
            f"could not create the tf-keras peer environment {PEER_VENV} (pip install "
            f"{tensorflow_requirement} {tf_keras_requirement}); it needs PyPI. Remove the "
            f"directory and retry, or install those two into it by hand.\n{error}") from error
    if output.strip().splitlines()[-1] != expected:
        raise JobFailed(f"{PEER_VENV} holds TensorFlow {output.strip()!r}, expected {expected!r}")
    return python


def _tail(text):
    return text[-TAIL_CHARS:] if len(text) > TAIL_CHARS else text


def _run(command, env=None, timeout=JOB_TIMEOUT_S):
    """Run `command` (its own process group) to completion; raise with its output's tail."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher's ranks too
        output, _ = proc.communicate()
        raise JobFailed(f"timed out after {timeout} s: {' '.join(command)}\n"
                        f"{_tail(output)}") from None
    if proc.returncode != 0:
        raise JobFailed(f"exit code {proc.returncode}: {' '.join(command)}\n{_tail(output)}")
    return output, time.perf_counter() - start


def _worker_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TFDIST_", "HOROVOD_", "OMPI_", "PMI_")) and k != "TF_CONFIG"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def launch_tfdist(processes, out, strategy, options):
    """One tfdist job (Keras 3) under tfdist-run; co-located servers for the PS strategy."""
    command = [sys.executable, "-m", "tfdist.launch", "-np", str(processes), "--timeout", "120",
               sys.executable, WORKER, out, strategy, *options]
    print("$ tfdist-run", " ".join(command[3:]), flush=True)
    return _run(command, env=_worker_env())[1]


def launch_mwms(python, processes, out, options):
    """One tf-keras + MultiWorkerMirroredStrategy job: a process per worker, each its TF_CONFIG."""
    from tfdist.comm.ports import pick_ports  # pylint: disable=import-outside-toplevel

    workers = [f"127.0.0.1:{port}" for port in pick_ports(processes)]
    print(f"$ TF_CONFIG=... x{processes} {os.path.relpath(python, HERE)} peer_worker.py "
          f"{out} mwms {' '.join(options)}", flush=True)
    logs, procs = [], []
    start = time.perf_counter()
    try:
        for index in range(processes):
            env = _worker_env()
            env["TF_USE_LEGACY_KERAS"] = "1"
            env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers},
                                           "task": {"type": "worker", "index": index}})
            log = open(f"{out}.worker{index}.log", "w+")  # pylint: disable=consider-using-with
            logs.append(log)
            procs.append(subprocess.Popen([python, WORKER, out, "mwms", *options], env=env,
                                          stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        deadline = start + JOB_TIMEOUT_S
        failed = None
        while failed is None and any(p.poll() is None for p in procs):
            failed = next((i for i, p in enumerate(procs) if p.poll() not in (None, 0)), None)
            if time.perf_counter() > deadline:
                failed = next(i for i, p in enumerate(procs) if p.poll() is None)
            time.sleep(0.2)
        if failed is None:
            failed = next((i for i, p in enumerate(procs) if p.returncode != 0), None)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        outputs = []
        for log in logs:
            log.seek(0)
            outputs.append(log.read())
            log.close()
    if failed is not None:
        code = procs[failed].returncode
        why = "timed out" if code == -signal.SIGKILL else f"exit code {code}"
        raise JobFailed(f"MWMS worker {failed} of {processes}: {why} "
                        f"({JOB_TIMEOUT_S} s limit)\n{_tail(outputs[failed])}")
    return time.perf_counter() - start


def _job(python, tmp, name, processes, options, tag):
    out = os.path.join(tmp, f"peer_{tag}_{name}_P{processes}.json")
    if name == "mwms":
        wall = launch_mwms(python, processes, out, options)
    else:
        wall = launch_tfdist(processes, out, name, options)
    with open(out) as f:
        result = json.load(f)
    result["job_seconds"] = wall
    return result


def _reference(python, tmp, framework, exact_dir):
    """One plain process of `framework` (no strategy): the weights a distributed run must match."""
    out = os.path.join(tmp, f"peer_reference_{framework}.json")
    command = ([python, WORKER, out, "tf_keras", "--exact", exact_dir] if framework == "tf_keras"
               else [sys.executable, WORKER, out, "keras3", "--exact", exact_dir])
    env = _worker_env()
    if framework == "tf_keras":
        env["TF_USE_LEGACY_KERAS"] = "1"
    print("$", os.path.basename(command[0]), " ".join(command[1:]), flush=True)
    _run(command, env=env)


def max_weight_difference(path_a, path_b):
    """Largest absolute difference between two saved weight lists (npz, arr_0 ..)."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    with np.load(path_a) as a, np.load(path_b) as b:
        if len(a.files) != len(b.files):
            raise ValueError(f"{path_a} and {path_b} hold different numbers of weights")
        return max(float(np.max(np.abs(a[f"arr_{i}"] - b[f"arr_{i}"])))
                   for i in range(len(a.files)))


def run(tmp, rounds=ROUNDS, processes=PROCESSES, timing_epochs=None):
    start = time.perf_counter()
    python = peer_python()
    exact_dir = os.path.join(tmp, "peer_exact")
    os.makedirs(exact_dir, exist_ok=True)
    # Keras 3 first: it saves the initial weights every other run starts from.
    _reference(python, tmp, "keras3", exact_dir)
    _reference(python, tmp, "tf_keras", exact_dir)
    timing = ["--time"] + (["--epochs", str(timing_epochs)] if timing_epochs else [])
    runs = {(name, p): [] for name in ORDER for p in processes}
    for round_ in range(rounds):
        order = ORDER if round_ % 2 == 0 else tuple(reversed(ORDER))
        for p in processes:
            for name in order:
                options = timing + (["--exact", exact_dir] if round_ == 0 else [])
                runs[name, p].append(_job(python, tmp, name, p, options, f"r{round_}"))
    rows, summary = [], {}
    for model in MODELS:
        for p in processes:
            peer = [r["models"][model] for r in runs["mwms", p]]
            for name in OUR_STRATEGIES:
                ours = [r["models"][model] for r in runs[name, p]]
                step_ratios = per_round_ratios(ours, peer, "median_step_ms")
                epoch_ratios = per_round_ratios(ours, peer, "seconds_per_epoch")
                exact = os.path.join(exact_dir, f"{name}_P{p}_{model}.npz")
                peer_exact = os.path.join(exact_dir, f"mwms_P{p}_{model}.npz")
                row = {
                    "model": model, "processes": p, "strategy": name,
                    "parameters": ours[0]["parameters"], "global_batch": ours[0]["global_batch"],
                    "steps_timed_per_run": ours[0]["steps_timed"],
                    "tfdist_median_step_ms": statistics.median(o["median_step_ms"] for o in ours),
                    "mwms_median_step_ms": statistics.median(m["median_step_ms"] for m in peer),
                    "tfdist_seconds_per_epoch": statistics.median(
                        o["seconds_per_epoch"] for o in ours),
                    "mwms_seconds_per_epoch": statistics.median(
                        m["seconds_per_epoch"] for m in peer),
                    "step_ratio_per_round": step_ratios,
                    "step_ratio_median": statistics.median(step_ratios),
                    "epoch_ratio_per_round": epoch_ratios,
                    "epoch_ratio_median": statistics.median(epoch_ratios),
                    "rounds_tfdist_faster_step": sum(r < 1 for r in step_ratios),
                    "rounds_tfdist_faster_epoch": sum(r < 1 for r in epoch_ratios),
                    "rounds": len(step_ratios),
                    "tfdist_max_weight_difference_vs_1_process": max_weight_difference(
                        exact, os.path.join(exact_dir, f"keras3_P1_{model}.npz")),
                    "mwms_max_weight_difference_vs_1_process": max_weight_difference(
                        peer_exact, os.path.join(exact_dir, f"tf_keras_P1_{model}.npz")),
                }
                rows.append(row)
                summary[f"{model}_P{p}_{name}"] = {
                    "step_ratio_median": round(row["step_ratio_median"], 3),
                    "epoch_ratio_median": round(row["epoch_ratio_median"], 3),
                    "faster_rounds": f"{row['rounds_tfdist_faster_step']}/{row['rounds']}",
                    "faster_rounds_epoch": f"{row['rounds_tfdist_faster_epoch']}/{row['rounds']}",
                    "weight_diff_tfdist": row["tfdist_max_weight_difference_vs_1_process"],
                    "weight_diff_mwms": row["mwms_max_weight_difference_vs_1_process"]}
    frameworks = {model: max_weight_difference(
        os.path.join(exact_dir, f"keras3_P1_{model}.npz"),
        os.path.join(exact_dir, f"tf_keras_P1_{model}.npz")) for model in MODELS}
    peer_versions = runs["mwms", processes[0]][0]["versions"]
    result = {
        "summary": summary,
        "rows": rows,
        "one_process_keras3_vs_tf_keras_max_weight_difference": frameworks,
        "runs": {f"{name}_P{p}": results for (name, p), results in runs.items()},
        "rounds": rounds,
        "peer": {"framework": "tf-keras + tf.distribute.MultiWorkerMirroredStrategy",
                 **peer_versions},
        "minutes": round((time.perf_counter() - start) / 60, 1),
        "description": (
            "tfdist (Keras 3; RingAllReduceStrategy(backend='collective'), "
            "ReductionTreeStrategy(), ParameterServerStrategy() with co-located servers; "
            "tfdist-run) against tf-keras (Keras 2, TF_USE_LEGACY_KERAS=1) with "
            "MultiWorkerMirroredStrategy (one process per worker, TF_CONFIG 'worker' job on "
            "localhost, its default collective implementation), same TensorFlow, one "
            "worker script. Models: 'cnn' = the digits demo's CNN without Dropout (8x8x1, "
            "1408 random samples, global batch 64, 22 steps per epoch, 5 epochs); 'mlp' = "
            "784-2048-2048-10 (5.8 M parameters, 64 rows per process, 10 steps per epoch, 4 "
            "epochs). SGD(0.05, momentum=0.9), sparse categorical cross-entropy, accuracy "
            "metric, no shuffle, one "
            "intra-op thread per process, all processes on one 2-core host (loopback). Step = "
            "Keras' batch begin to batch end (one train-function call), epochs after the "
            "first (88 and 30 steps per run); seconds_per_epoch = median epoch wall time "
            "after the first (epoch boundaries included). Rounds "
            "interleaved (ring, mwms, tree, ps; reversed every other round), per P; ratios "
            "are tfdist / MWMS within one round (paired), then the median over rounds; "
            "rounds_tfdist_faster = rounds with ratio < 1; goal: ratio <= 0.9. Correctness "
            "(first round): 100 samples, global batch 64 (last batch 36; on 3 processes the "
            "batches of 64 split unevenly), SGD(0.1) without momentum, 2 epochs, no shuffle, "
            "all runs from the same saved initial weights; max |w_rank0 - w_1process| "
            "against one plain process of the same framework (no strategy)."),
    }
    write_result("peer.json", result)
    plot(rows)
    print(f"peer: {result['minutes']} min", flush=True)
    return result


def plot(rows):
    """Per model and process count: each round's tfdist / MWMS step ratio and the median."""
    plt = pyplot()
    if plt is None:
        return
    panels = [(m, p) for m in MODELS for p in sorted({r["processes"] for r in rows})]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 4), sharey=True,
                             squeeze=False)
    axes = axes[0]
    colors = {"ring": "tab:blue", "tree": "tab:green", "ps": "tab:orange"}
    for ax, (model, p) in zip(axes, panels):
        for index, name in enumerate(OUR_STRATEGIES):
            row = next(r for r in rows if (r["model"], r["processes"], r["strategy"]) ==
                       (model, p, name))
            ratios = row["step_ratio_per_round"]
            ax.scatter([index] * len(ratios), ratios, color=colors[name], alpha=0.5, s=16)
            ax.hlines(row["step_ratio_median"], index - 0.3, index + 0.3, color=colors[name],
                      linewidth=2.5)
            ax.annotate(f"{row['step_ratio_median']:.2f}", (index + 0.32,
                        row["step_ratio_median"]), fontsize=7, va="center")
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.axhline(GOAL, color="tab:red", linestyle="--", linewidth=1, label=f"goal {GOAL}x")
        ax.set_xticks(range(len(OUR_STRATEGIES)), OUR_STRATEGIES)
        ax.set_xlim(-0.6, len(OUR_STRATEGIES) - 0.2)
        ax.set_title(f"{model}, P = {p}", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("median step time, tfdist / MWMS")
    axes[0].legend(fontsize=7)
    fig.suptitle("tfdist vs tf-keras + MultiWorkerMirroredStrategy: paired step-time ratio "
                 "(dots: rounds, bar: median)", fontsize=10)
    fig.tight_layout()
    save(fig, "peer_step_ratio.png")
