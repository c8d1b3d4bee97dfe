"""What the cluster changes cost: the parameter server's workers on Open MPI's engine, start-up.

Two questions, each answered against a baseline measured in the same run, interleaved over
rounds (the machine is shared and noisy: read the ratios):

* `ps_step`: the synchronous parameter server's median step under plain `tfdist-run`, its
  workers' own collectives (metrics, flags, broadcasts) on Open MPI's engine - what an MPI job
  now uses, instead of a TensorFlow gRPC server on every interface - against the same job
  with `--no-mpi` (TensorFlow's collectives, the workers' engine before);
* `startup`: seconds from `tfdist-run` to the first training step (strategy built: the ranks'
  agreement, the watchdog of `MPI_Init`, liveness ports) of the default job.

    python -m benchmarks.cluster_costs OUT.json [ROUNDS]   # or tfdist-bench --only cluster
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "cluster_costs_worker.py")


def _run(flags, out):
    from benchmarks.harness import worker_env  # pylint: disable=import-outside-toplevel

    command = [sys.executable, "-m", "tfdist.launch", "-np", "2", *flags, sys.executable,
               WORKER, out]
    subprocess.run(command, env=worker_env(), check=True, capture_output=True, timeout=600)
    with open(out) as f:
        return json.load(f)


def measure(rounds=3):
    configs = {"ps_workers_on_mpi": [], "ps_workers_on_tf_collectives": ["--no-mpi"]}
    rows = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(rounds):
            for name, flags in configs.items():
                result = _run(flags, os.path.join(tmp, f"{name}-{round_}.json"))
                rows[name].append(result)
                print(name, result, flush=True)
    median = {name: statistics.median(r["median_step_ms"] for r in results)
              for name, results in rows.items()}
    ratios = [a["median_step_ms"] / b["median_step_ms"]
              for a, b in zip(rows["ps_workers_on_mpi"], rows["ps_workers_on_tf_collectives"])]
    return {
        "description": __doc__.split("\n\n")[0],
        "rounds": rounds,
        "median_step_ms": median,
        "ps_step_mpi_over_tf_collectives_per_round": ratios,
        "ps_step_mpi_over_tf_collectives_median": statistics.median(ratios),
        "seconds_to_first_step_median": {
            name: statistics.median(r["seconds_to_first_step"] for r in results)
            for name, results in rows.items()},
        "rows": rows,
    }


def main():
    out = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    result = measure(rounds)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    main()
