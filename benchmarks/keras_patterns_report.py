"""Per-case differences between N processes and one for the keras.io-style pattern suite.

    python -m benchmarks.keras_patterns_report [--configurations ring-collective-2,...]

Runs tests/scripts/keras_patterns.py once on one process (the reference)
and once per configuration (every synchronous strategy, 2 and 3 processes),
and writes benchmarks/results/keras_patterns.json: for every case, the
largest absolute and relative difference to one process over its weights,
logged history, evaluation and predictions, and whether all ranks agree
exactly. The tests (tests/test_keras_patterns.py) assert the same
tolerances; this records the measured numbers. Cases that cannot match one
process by construction (BatchNorm batch statistics per slice, an unseeded
shuffle) are reported with rank agreement only.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SCRIPT = os.path.join(REPO, "tests", "scripts", "keras_patterns.py")
RESULT = os.path.join(HERE, "results", "keras_patterns.json")
RANK_AGREEMENT_ONLY = ("batchnorm_empty_slices", "pydataset_unseeded")
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")

CONFIGURATIONS = {
    # name: (processes, launcher, script arguments)
    "ring-collective-2": (2, "tfdist-run", ["--strategy", "ring", "--backend", "collective"]),
    "ring-collective-3": (3, "tfdist-run", ["--strategy", "ring", "--backend", "collective"]),
    "ring-horovod-2": (2, "horovodrun", ["--strategy", "ring", "--backend", "horovod"]),
    "ring-horovod-3": (3, "horovodrun", ["--strategy", "ring", "--backend", "horovod"]),
    "tree-2": (2, "tfdist-run", ["--strategy", "tree"]),
    "tree-3": (3, "tfdist-run", ["--strategy", "tree"]),
    "ps-colocated-2": (2, "tfdist-run", ["--strategy", "ps"]),
    "ps-dedicated-3x2": (3, "tfdist-run --num-servers 2", ["--strategy", "ps"]),
}


def launch(processes, launcher, args, timeout=1200):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TFDIST_TIMEOUT="180")
    if processes == 1:
        command = [sys.executable, SCRIPT] + args
    elif launcher == "horovodrun":
        command = [HOROVODRUN, "--gloo", "-np", str(processes), "-H",
                   f"localhost:{processes}", sys.executable, SCRIPT] + args
    else:
        command = ([sys.executable, "-m", "tfdist.launch", "-np", str(processes)]
                   + launcher.split()[1:] + [sys.executable, SCRIPT] + args)
    print("$", " ".join(command[1:]), flush=True)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def load(prefix, processes):
    return [dict(np.load(f"{prefix}.rank{rank}.npz")) for rank in range(processes)]


def compare(reference, ranks):
    """Per case: max |difference| and max relative difference to one process; rank agreement."""
    chief, cases = ranks[0], {}
    for key, value in chief.items():
        case = key.split("/")[0]
        entry = cases.setdefault(case, {"max_abs_difference": 0.0, "max_rel_difference": 0.0,
                                        "ranks_identical": True,
                                        "compared_with_one_process":
                                            not case.startswith(RANK_AGREEMENT_ONLY)})
        entry["ranks_identical"] &= all(np.array_equal(other[key], value) for other in ranks[1:])
        if entry["compared_with_one_process"]:
            difference = np.abs(value.astype("float64") - reference[key].astype("float64"))
            scale = np.maximum(np.abs(reference[key].astype("float64")), 1e-12)
            entry["max_abs_difference"] = max(entry["max_abs_difference"],
                                              float(difference.max(initial=0.0)))
            entry["max_rel_difference"] = max(entry["max_rel_difference"],
                                              float((difference / scale).max(initial=0.0)))
    return cases


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configurations", default=",".join(CONFIGURATIONS))
    args = parser.parse_args(argv)
    names = args.configurations.split(",")
    from benchmarks.harness import environment  # imports TensorFlow: only when the report runs

    report = {"environment": environment(),
              "description": __doc__.split("\n\n", 2)[1].replace("\n", " "), "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        reference_prefix = os.path.join(tmp, "np1")
        launch(1, None, [reference_prefix])
        reference = load(reference_prefix, 1)[0]
        for name in names:
            processes, launcher, script_args = CONFIGURATIONS[name]
            prefix = os.path.join(tmp, name)
            launch(processes, launcher, [prefix] + script_args)
            cases = compare(reference, load(prefix, processes))
            worst = max((c["max_abs_difference"] for c in cases.values()), default=0.0)
            report["runs"][name] = {"processes": processes, "cases": cases,
                                    "worst_abs_difference": worst}
            print(f"{name}: worst |difference| {worst:.2e}, ranks identical: "
                  f"{all(c['ranks_identical'] for c in cases.values())}", flush=True)
    os.makedirs(os.path.dirname(RESULT), exist_ok=True)
    with open(RESULT, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {RESULT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
