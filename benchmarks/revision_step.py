"""`tfdist-bench --only revision`: this checkout's training step against another revision's.

Whether a change to the library made the step slower, measured as the
benchmarks measure everything here: in one run, in interleaved rounds, as
ratios within a round. The other revision (`--baseline`, default the one
`BASELINE` names) is exported from git into a scratch folder and put first
on `PYTHONPATH`, so its `tfdist-run` and its library train the same worker
(`peer_worker.py`, public API only: the digits-sized CNN at global batch 64
and the 5.8 M-parameter MLP at 64 rows per process, SGD with momentum, one
intra-op thread per process; median Keras step of the epochs after the
first) on the same machine in the same minutes. Configurations, 2
processes under `tfdist-run`:

* auto          `RingAllReduceStrategy()`: the engine a user's script gets;
* collective    `RingAllReduceStrategy(backend="collective")` (TensorFlow's ring);
* sharded       `RingAllReduceStrategy(shard_optimizer_state=True)`;
* ps            `ParameterServerStrategy()` (synchronous, co-located servers).

Each round runs every configuration on both revisions, the order of the
revisions alternating between rounds. The ratio is this checkout's median
step over the baseline's in the same round; the summary is the median over
rounds. Result: benchmarks/results/revision_step.json.

    python -m benchmarks.revision_step [--baseline REV] [--rounds 3] [--epochs 3]
        [--configs auto collective sharded ps] [--models cnn mlp] [--out NAME]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks.harness import HERE, REPO, git_commit, worker_env, write_result

# The revision before the modes became objects (issue "Modes as objects").
BASELINE = "b48c126"
CONFIGS = {
    "auto": ["auto"],
    "collective": ["ring"],
    "sharded": ["auto", "--shard-optimizer-state"],
    "ps": ["ps"],
}
MODELS = ("cnn", "mlp")
PROCESSES = 2


def export_revision(revision, directory):
    """`revision`'s library (the tfdist package) in `directory`; its full commit."""
    sha = subprocess.run(["git", "rev-parse", revision], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.strip()
    archive = subprocess.run(["git", "archive", sha, "tfdist"], cwd=REPO, capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", directory], input=archive, check=True)
    return sha


def run_config(library, out, options, epochs, models=MODELS):
    """One 2-process job of `peer_worker.py` with the library at `library` first on the path;
    its models' results."""
    env = worker_env()
    env["PYTHONPATH"] = os.pathsep.join([library, env["PYTHONPATH"]])
    command = [sys.executable, "-m", "tfdist.launch", "-np", str(PROCESSES), sys.executable,
               os.path.join(HERE, "peer_worker.py"), out, *options, "--time", "--epochs",
               str(epochs), "--models", *models]
    print("$", f"PYTHONPATH={library}:...", " ".join(command[2:]), flush=True)
    subprocess.run(command, env=env, check=True, cwd=REPO)
    with open(out) as f:
        return json.load(f)["models"]


def run(tmp, baseline=BASELINE, rounds=3, epochs=3, configs=tuple(CONFIGS), models=MODELS,
        out="revision_step.json"):
    base_dir = os.path.join(tmp, "baseline")
    os.makedirs(base_dir, exist_ok=True)
    base_sha = export_revision(baseline, base_dir)
    trees = {"baseline": base_dir, "current": REPO}
    runs = []
    for round_index in range(rounds):
        order = ["baseline", "current"] if round_index % 2 == 0 else ["current", "baseline"]
        for config in configs:
            for tree in order:
                path = os.path.join(tmp, f"revision_{round_index}_{config}_{tree}.json")
                timed = run_config(trees[tree], path, CONFIGS[config], epochs, models)
                runs.append({"round": round_index, "config": config, "tree": tree,
                             **{f"{m}_median_step_ms": timed[m]["median_step_ms"]
                                for m in models}})
    summary = {}
    for config in configs:
        for model in models:
            key = f"{model}_median_step_ms"
            ratios = []
            for round_index in range(rounds):
                pair = {r["tree"]: r[key] for r in runs
                        if r["round"] == round_index and r["config"] == config}
                ratios.append(pair["current"] / pair["baseline"])
            summary[f"{config}_{model}"] = {
                "current_over_baseline_per_round": [round(r, 3) for r in ratios],
                "current_over_baseline": round(statistics.median(ratios), 3)}
    result = {
        "baseline_commit": base_sha,
        "current_commit": git_commit(),
        "processes": PROCESSES,
        "summary": summary,
        "runs": runs,
        "description": "Median Keras step (epochs after the first) of peer_worker.py's digits "
                       "CNN and 5.8 M-parameter MLP, 2 processes under tfdist-run, with this "
                       "checkout's library and with the baseline revision's, in interleaved "
                       "rounds (the revisions' order alternating); current_over_baseline is "
                       "the median over rounds of the same round's ratio: below 1 the "
                       "checkout is faster. This machine is shared: a ratio moves by several "
                       "percent between runs.",
    }
    write_result(out, result)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE, help="the git revision to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3, help="per model, the first untimed")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--out", default="revision_step.json",
                        help="the result's file name under benchmarks/results/")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = run(tmp, args.baseline, args.rounds, args.epochs, args.configs,
                     tuple(args.models), args.out)
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
