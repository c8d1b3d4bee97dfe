"""`tfdist-bench --only anatomy`: what a distributed training step costs beyond one process's.

The digits demo job (global batch 64) on 1 process and on 2 processes for
each strategy (ring on TF collectives, on Horovod over Gloo and on Horovod
over MPI under mpirun, tree, co-located parameter server), the ring again
with a user's epoch-level callback, and a control (two independent single
processes at batch 32 at once, each pinned to its own core with one intra-op
thread as tfdist-run starts its ranks: the fair floor), in interleaved rounds: per step, the communications
inside the compiled step, the eager exchanges between steps, the Python
batch callbacks tfdist adds, the communication time (tfdist's counters) and
the wall time, and each configuration's step time over one process's; the
ring once more with TensorFlow's default thread pools (no thread split).
Result: benchmarks/results/step_anatomy.json.
"""

import json
import os
import statistics
import subprocess
import sys

from benchmarks.harness import (HERE, fair_floor_process, mpirun_available, mpirun_command,
                                mpirun_env, per_round_ratios, write_result)

ROUNDS = 4
CONFIGS = {  # name: (processes, launcher, launcher flags, worker arguments)
    "1_process": (1, "tfdist-run", [], ["ring"]),
    "ring_collective": (2, "tfdist-run", [], ["ring", "collective"]),
    "ring_horovod": (2, "tfdist-run", ["--horovod"], ["ring", "horovod"]),
    "ring_horovod_mpi": (2, "mpirun", [], ["ring", "horovod"]),  # Open MPI: shared memory
    "tree": (2, "tfdist-run", [], ["tree"]),
    "ps_colocated": (2, "tfdist-run", [], ["ps"]),
    "ring_collective_user_callback": (2, "tfdist-run", [], ["ring", "collective",
                                                             "--user-callback"]),
    "2_independent_batch_32": (2, "independent", [], ["ring", "--batch", "32"]),
    "ring_collective_default_threads": (2, "tfdist-run", [], ["ring", "collective"]),
}
CONFIG_ENV = {  # name: environment variables of its processes
    "ring_collective_default_threads": {"TFDIST_INTRA_OP_THREADS": "0"},  # no thread split
}


def _job(tmp, name, index):
    processes, launcher, flags, arguments = CONFIGS[name]
    out = os.path.join(tmp, f"anatomy{index}.json")
    worker = [sys.executable, os.path.join(HERE, "step_anatomy.py"), out, *arguments]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **CONFIG_ENV.get(name, {}))
    if launcher == "mpirun":
        subprocess.run(mpirun_command(processes) + worker, env=mpirun_env(), check=True)
    elif launcher == "independent":  # separate single processes, started together
        outs = [f"{out}.{i}" for i in range(processes)]
        started = [fair_floor_process(i, [worker[0], worker[1], each, *arguments], env)
                   for i, each in enumerate(outs)]  # pinned, one intra-op thread: the fair floor
        children = [subprocess.Popen(command, env=child_env) for command, child_env in started]
        if any(child.wait() != 0 for child in children):
            raise RuntimeError(f"anatomy: an independent process of {name} failed")
        results = []
        for each in outs:
            with open(each) as f:
                results.append(json.load(f))
        slowest = max(results, key=lambda r: r["median_step_ms"])
        return dict(slowest, processes=processes)
    else:
        command = [sys.executable, "-m", "tfdist.launch", "-np", str(processes), *flags] + worker
        subprocess.run(command, env=env, check=True)
    with open(out) as f:
        return json.load(f)


def _paired(runs, name, baseline):
    """Per-round ratios name / baseline (same round, so the same machine load) and medians."""
    ratios = {}
    for key in ("median_step_ms", "ms_per_step"):
        per_round = per_round_ratios(runs[name], runs[baseline], key)
        ratios[key] = {"per_round": per_round, "median": statistics.median(per_round),
                       "rounds_slower": sum(r > 1 for r in per_round)}
    ratios["eager_exchanges_per_step"] = runs[name][-1]["eager_exchanges_per_step"]
    ratios["batch_callbacks_per_step"] = runs[name][-1]["batch_callbacks_per_step"]
    return ratios


def run(tmp):
    configs = [name for name in CONFIGS
               if CONFIGS[name][1] != "mpirun" or mpirun_available()]
    if len(configs) < len(CONFIGS):
        print("anatomy: no mpirun or no Horovod built with MPI here: ring_horovod_mpi left out",
              flush=True)
    runs = {name: [] for name in configs}
    index = 0
    for round_ in range(ROUNDS):
        names = configs if round_ % 2 == 0 else list(reversed(configs))
        for name in names:
            index += 1
            runs[name].append(_job(tmp, name, index))
    one = statistics.median(r["ms_per_step"] for r in runs["1_process"])
    one_step = statistics.median(r["median_step_ms"] for r in runs["1_process"])
    table = {}
    for name, results in runs.items():
        last = results[-1]
        ms = statistics.median(r["ms_per_step"] for r in results)
        step = statistics.median(r["median_step_ms"] for r in results)
        comm = [r["communication"].get("comm_ms") for r in results if r["communication"]]
        table[name] = {
            "ms_per_step": ms, "over_1_process": ms / one,
            "median_step_ms": step, "median_step_over_1_process": step / one_step,
            "comm_ms_per_step": statistics.median(comm) if comm else 0.0,
            "in_step_communications_per_step": last["in_step_communications_per_step"],
            "eager_exchanges_per_step": last["eager_exchanges_per_step"],
            "batch_callbacks_per_step": last["batch_callbacks_per_step"],
            "intra_op_threads": last.get("intra_op_threads"),
            "samples_ms_per_step": [r["ms_per_step"] for r in results],
            "samples_median_step_ms": [r["median_step_ms"] for r in results]}
    result = {"summary": {name: round(row["over_1_process"], 2) for name, row in table.items()},
              "summary_median_step": {name: round(row["median_step_over_1_process"], 2)
                                      for name, row in table.items()},
              "configurations": table, "rounds": ROUNDS,
              "description": "digits demo job, global batch 64, 4 epochs (steps of epochs 2-4 "
                             "timed); per step: communications inside the compiled step "
                             "(tfdist's counters), eager exchanges between steps (Keras' loop "
                             "reading stop_training), Python batch callbacks (not Keras' "
                             "no-ops), communication time, wall time (epoch boundaries "
                             "included) and the median train-function call (Keras' batch "
                             "begin to end); summary: wall time per step over one process's "
                             "(same global batch), summary_median_step: the same for the "
                             "median step; medians of the rounds. 2_independent_batch_32: two "
                             "single processes at once, batch 32 each, the slower one's "
                             "numbers (communication free: the floor for 2 processes on "
                             "this host). user_callback_cost: ring with a user's "
                             "epoch-end callback over the ring without, paired per round. "
                             "thread_split_gain: the ring with one intra-op thread per "
                             "process (tfdist's default on a shared host) over the ring "
                             "with TensorFlow's default pools, paired per round."}
    result["user_callback_cost"] = _paired(runs, "ring_collective_user_callback",
                                           "ring_collective")
    result["thread_split_gain"] = _paired(runs, "ring_collective",
                                          "ring_collective_default_threads")
    write_result("step_anatomy.json", result)
    return result
