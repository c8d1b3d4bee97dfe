"""Horovod's cycle time on a 2-core host: what it costs a big and a small model's step, against TensorFlow's ring.

Question (issue 52: plain `tfdist-run` now gives `backend="auto"` Horovod's engine): is
tfdist's default `HOROVOD_CYCLE_TIME` of 0.1 ms (chosen on the digits job for its latency)
right for every model, and is Horovod's engine the faster one for small models too? Horovod's
background thread wakes every cycle and negotiates with its peers; on a host whose cores
the training already fills, that thread's CPU time is taken from the step.

    .venv/bin/python -m experiments.horovod_cycle_time [--rounds 3] [--models mlp cnn]

For each model of `benchmarks/peer_worker.py` (the 5.8 M-parameter MLP with SGD and
momentum; the small CNN), in rounds whose order alternates: the no-communication floor (2
plain Keras processes at once), the TF ring (`backend="collective"`) and Horovod's engine on
Gloo at cycle times 0.1, 1 and 5 ms, each a 2-process `tfdist-run` job; the median step of
the epochs after the first, then each configuration over the same round's floor, the median
over rounds. Results: experiments/results/horovod_cycle_time.json.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks import peer_report
from benchmarks.harness import HERE, write_result

WORKER = os.path.join(HERE, "peer_worker.py")
CYCLES_MS = ("0.1", "1", "5")
CONFIGS = ("floor", "ring") + tuple(f"horovod_{c}ms" for c in CYCLES_MS)
EPOCHS = 4  # the first untimed
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _worker(out, strategy, model):
    return [sys.executable, WORKER, out, strategy, "--time", "--models", model,
            "--epochs", str(EPOCHS)]


def _step_ms(path, model):
    with open(path) as f:
        return json.load(f)["models"][model]["median_step_ms"]


def _run(tmp, tag, config, model):
    env = peer_report._worker_env()  # pylint: disable=protected-access
    out = os.path.join(tmp, f"{tag}.json")
    if config == "floor":
        outs = [f"{out}.{i}" for i in range(2)]
        procs = [subprocess.Popen(_worker(o, "keras3", model), env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for o in outs]
        for proc in procs:
            if proc.wait(timeout=peer_report.JOB_TIMEOUT_S) != 0:
                raise peer_report.JobFailed(f"floor: exit code {proc.returncode}")
        return statistics.median(_step_ms(o, model) for o in outs)
    if config.startswith("horovod_"):
        env["HOROVOD_CYCLE_TIME"] = config[len("horovod_"):-len("ms")]
    strategy = "ring" if config == "ring" else "horovod"
    command = [sys.executable, "-m", "tfdist.launch", "-np", "2", "--timeout", "120",
               *_worker(out, strategy, model)]
    print("$", " ".join(command), f"(HOROVOD_CYCLE_TIME={env.get('HOROVOD_CYCLE_TIME')})",
          flush=True)
    peer_report._run(command, env=env)  # pylint: disable=protected-access
    return _step_ms(out, model)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    args = parser.parse_args(argv)
    steps = {model: {c: [] for c in CONFIGS} for model in args.models}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            for round_ in range(args.rounds):
                for config in CONFIGS if round_ % 2 == 0 else tuple(reversed(CONFIGS)):
                    steps[model][config].append(
                        _run(tmp, f"{model}_r{round_}_{config}", config, model))
    over_floor = {model: {c: [s / f for s, f in zip(runs[c], runs["floor"])]
                          for c in CONFIGS[1:]} for model, runs in steps.items()}
    summary = {f"{model}_{c}_over_floor": round(statistics.median(ratios), 3)
               for model, by_config in over_floor.items() for c, ratios in by_config.items()}
    write_result("horovod_cycle_time.json", {
        "summary": summary, "steps_ms": steps, "over_floor_per_round": over_floor,
        "rounds": args.rounds,
        "description": "2 processes under tfdist-run on this host; peer_worker.py's MLP "
                       "(5.8 M parameters, SGD + momentum, 64 rows per process) and CNN; "
                       "each configuration's median step over the same round's "
                       "no-communication floor (2 plain Keras processes), median over "
                       "rounds; horovod_<c>ms: Horovod's engine on Gloo with "
                       "HOROVOD_CYCLE_TIME=<c>."}, results=RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
