"""Does an Open MPI setting make the MPI engine's all-reduce of a big model's gradient faster?

For issue 65: the 5.8 M MLP's 23.2 MB all-reduce is most of what is left of its
2-process step over the floor on the MPI engine (`step_passes.py`). Open MPI picks
its all-reduce algorithm per message size and its shared-memory transport's copy
mechanism itself; this runs `step_passes.py`'s `all_reduce` piece (and the fresh
tensor it is measured over) once per setting, each in its own `mpirun -np 2`
(bound to a core each), the settings one after another in 2 rounds:

* Open MPI's defaults;
* `coll_tuned_allreduce_algorithm` forced (with `coll_tuned_use_dynamic_rules 1`):
  3 recursive doubling, 4 ring, 5 segmented ring, 6 Rabenseifner's; 4 with 1 MiB
  segments;
* `btl_vader_single_copy_mechanism`: `cma` (process_vm_readv, the default here) and
  `none` (copies through the shared-memory segment).

Writes `experiments/results/open_mpi_settings.json`: per setting, the all-reduce's
median milliseconds over making the tensor, per round.

    python -m experiments.open_mpi_settings   # as root: OMPI_ALLOW_RUN_AS_ROOT=1 ...
"""

import json
import os
import subprocess
import sys
import tempfile

from benchmarks.harness import environment

ROUNDS = 2
TUNED = {"coll_tuned_use_dynamic_rules": "1"}
SETTINGS = {
    "defaults": {},
    "recursive_doubling": dict(TUNED, coll_tuned_allreduce_algorithm="3"),
    "ring": dict(TUNED, coll_tuned_allreduce_algorithm="4"),
    "segmented_ring": dict(TUNED, coll_tuned_allreduce_algorithm="5"),
    "rabenseifner": dict(TUNED, coll_tuned_allreduce_algorithm="6"),
    "ring_1mib_segments": dict(TUNED, coll_tuned_allreduce_algorithm="4",
                               coll_tuned_allreduce_algorithm_segmentsize="1048576"),
    "single_copy_cma": {"btl_vader_single_copy_mechanism": "cma"},
    "single_copy_none": {"btl_vader_single_copy_mechanism": "none"},
}


def measure(setting, directory, round_):
    out = os.path.join(directory, f"{setting}_{round_}.json")
    env = dict(os.environ, PMIX_MCA_psec="native",
               **{f"OMPI_MCA_{k}": v for k, v in SETTINGS[setting].items()})
    root = ["--allow-run-as-root"] if os.getuid() == 0 else []
    subprocess.run(["mpirun", *root, "--bind-to", "core", "-np", "2", sys.executable, "-m",
                    "experiments.step_passes", "--only", "all_reduce", "--out", out],
                   env=env, check=True, timeout=600, capture_output=True)
    with open(out, encoding="utf-8") as f:
        return json.load(f)["over_fresh_tensor_ms"]["all_reduce"]


def main():
    per_round = {setting: [] for setting in SETTINGS}
    with tempfile.TemporaryDirectory() as directory:
        for round_ in range(ROUNDS):
            for setting in SETTINGS:
                per_round[setting].append(measure(setting, directory, round_))
                print(setting, per_round[setting], flush=True)
    result = {"description": __doc__.split("\n\n", 1)[0], "settings": SETTINGS,
              "all_reduce_ms_over_fresh_tensor_per_round": per_round,
              "environment": environment()}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                        "open_mpi_settings.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
