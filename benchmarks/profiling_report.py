"""`tfdist-bench --only profiling`: what profiling costs, against the commit before it existed.

The digits demo job (2 processes, ring on TF collectives) runs in rounds,
each round every configuration once, interleaved (this machine is shared and
noisy): this checkout and BASELINE_COMMIT (a git worktree: the code before
the communication counters and name scopes), each without a TensorBoard
callback, with `TensorBoard(update_freq="epoch")` and with
`TensorBoard(update_freq=1)`. Results: benchmarks/results/profiling_overhead.json.

* profiling off: this checkout without TensorBoard vs the baseline without;
* scalars on: this checkout with TensorBoard (tfdist's counters in the step,
  its scalars written at the TensorBoard's update_freq) vs the baseline with
  the same TensorBoard (Keras' own scalars only).

Then the same job, profiled by `tfdist-run --profile` (training batches
30-34, in the second epoch) for the ring, the tree and the co-located
parameter server: the merged timeline's overlap numbers
(benchmarks/results/overlap.json, overlap_<strategy>.png) and the ring's
timeline itself (timeline_ring.json, for Perfetto).
"""

import json
import os
import shutil
import statistics
import subprocess
import sys

from benchmarks.harness import HERE, REPO, RESULTS, write_result
from tfdist.profiling.names import FIGURE_FILE, OVERLAP_FILE, TIMELINE_FILE

BASELINE_COMMIT = "c8c161e"  # the last commit before profiling
ROUNDS = 6
MODES = ("none", "epoch", "batch")


def _job(tmp, code_dir, mode, index):
    """(ms per step, host ms per step in tfdist's scalars callback) of one 2-process job."""
    out = os.path.join(tmp, f"profiling{index}.json")
    # One intra-op thread per process: two processes on a 2-core machine, less noise.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=code_dir,
               TF_NUM_INTRAOP_THREADS="1")
    command = [sys.executable, "-m", "tfdist.launch", "-np", "2", sys.executable,
               os.path.join(HERE, "profiling_overhead.py"), out, mode,
               os.path.join(tmp, f"logs{index}")]
    subprocess.run(command, env=env, check=True, cwd=tmp)
    with open(out) as f:
        result = json.load(f)
    return result["ms_per_step"], result.get("scalars_host_ms_per_step", 0.0)


def run(tmp):
    baseline = os.path.join(tmp, "baseline")
    subprocess.run(["git", "worktree", "add", "--detach", baseline, BASELINE_COMMIT],
                   cwd=REPO, check=True)
    try:
        samples = {(code, mode): [] for code in ("current", "baseline") for mode in MODES}
        host = []
        index = 0
        for round_ in range(ROUNDS):
            order = list(samples) if round_ % 2 == 0 else list(reversed(samples))
            for code, mode in order:  # alternate the order: no configuration always goes first
                index += 1
                ms, host_ms = _job(tmp, REPO if code == "current" else baseline, mode, index)
                samples[(code, mode)].append(ms)
                if (code, mode) == ("current", "batch"):
                    host.append(host_ms)
                print(f"round {round_}: {code} {mode}: {ms:.2f} ms/step", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", baseline], cwd=REPO, check=False)
    median = {f"{code}/{mode}": statistics.median(values)
              for (code, mode), values in samples.items()}

    def paired(a, b):  # the median over rounds of the round's ratio
        return statistics.median(x / y for x, y in zip(samples[a], samples[b]))

    summary = {
        "off_over_baseline_paired": paired(("current", "none"), ("baseline", "none")),
        "scalars_epoch_over_baseline_tensorboard_paired": paired(("current", "epoch"),
                                                                 ("baseline", "epoch")),
        "scalars_every_step_over_baseline_tensorboard_paired": paired(("current", "batch"),
                                                                      ("baseline", "batch")),
        "scalars_host_ms_per_step_every_step": statistics.median(host),
        "scalars_host_share_of_step_every_step": (statistics.median(host)
                                                  / median["current/batch"]),
        "off_over_baseline": median["current/none"] / median["baseline/none"],
        "scalars_epoch_over_baseline_tensorboard": (median["current/epoch"]
                                                    / median["baseline/epoch"]),
        "scalars_every_step_over_baseline_tensorboard": (median["current/batch"]
                                                         / median["baseline/batch"]),
        "median_ms_per_step": median,
    }
    result = {"summary": summary,
              "samples_ms_per_step": {f"{c}/{m}": v for (c, m), v in samples.items()},
              "scalars_host_ms_per_step_samples": host,
              "baseline_commit": BASELINE_COMMIT, "rounds": ROUNDS,
              "description": "digits demo job, 2 processes, ring on TF collectives, global batch "
                             "64, one intra-op thread per process; ms per step = wall time of "
                             "epochs 2-5 / steps (callbacks "
                             "included); configurations interleaved per round; 'baseline' is "
                             "the commit before profiling, 'none' no TensorBoard, 'epoch' / "
                             "'batch' keras.callbacks.TensorBoard(update_freq='epoch' / 1); "
                             "*_paired: median over rounds of the ratio within a round; "
                             "scalars_host_*: time in tfdist's TensorBoard scalars callback "
                             "(reading the counters, writing the summaries) when it writes "
                             "after every step."}
    write_result("profiling_overhead.json", result)
    run_timelines(tmp)
    return result


def run_timelines(tmp):
    """Profile the digits job per strategy with tfdist-run --profile; keep the overlap numbers."""
    strategies = {}
    for strategy in ("ring", "tree", "ps"):
        log_dir = os.path.join(tmp, f"profile_{strategy}")
        command = [sys.executable, "-m", "tfdist.launch", "-np", "2", "--profile", log_dir,
                   "--profile-steps", "30:34", sys.executable,
                   os.path.join(REPO, "examples", "digits.py"), "--strategy", strategy,
                   "--epochs", "2", "--tensorboard", os.path.join(tmp, f"tensorboard_{strategy}")]
        subprocess.run(command, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), check=True)
        with open(os.path.join(log_dir, OVERLAP_FILE)) as f:
            overlap = json.load(f)
        shutil.copy(os.path.join(log_dir, FIGURE_FILE),
                    os.path.join(RESULTS, f"overlap_{strategy}.png"))
        if strategy == "ring":
            shutil.copy(os.path.join(log_dir, TIMELINE_FILE),
                        os.path.join(RESULTS, "timeline_ring.json"))
        steps = [s for numbers in overlap["ranks"].values() for s in numbers["steps"]]
        strategies[strategy] = {
            "hidden_share": overlap["hidden_share"],
            "instrumentation_share_of_step": (sum(s["instrumentation_ms"] for s in steps)
                                              / sum(s["step_ms"] for s in steps)),
            "ranks": {rank: {"total": numbers["total"], "phases_ms": numbers["phases_ms"],
                             "steps": len(numbers["steps"])}
                      for rank, numbers in overlap["ranks"].items()}}
    result = {"summary": {
                  "hidden_share": {s: round(v["hidden_share"], 3) for s, v in strategies.items()},
                  "counters_share_of_step": {s: round(v["instrumentation_share_of_step"], 4)
                                             for s, v in strategies.items()}},
              "strategies": strategies,
              "description": "digits demo job, 2 processes, training batches 30-34 profiled on "
                             "every rank by tfdist-run --profile and merged by "
                             "tfdist.profiling.timeline, with a TensorBoard callback (so tfdist's "
                             "communication counters are in the step); hidden_share: share of "
                             "communication time during which computation also ran (mean over "
                             "ranks); counters_share_of_step: time of the counters' own ops "
                             "(tfdist_counters/, union of their spans) over step time."}
    write_result("overlap.json", result)
    return result
