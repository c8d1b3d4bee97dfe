"""Run a tfdist training script under Ray Train's `TensorflowTrainer`, unchanged.

    python ray_train_job.py [--max-failures N] NUM_WORKERS SCRIPT [SCRIPT ARGS ...]

Starts a local Ray cluster, and a `TensorflowTrainer` with NUM_WORKERS workers
whose training function runs SCRIPT as `__main__` (with SCRIPT ARGS as its
argv). Ray sets TF_CONFIG in each worker before the function runs, which is
how tfdist finds its peers there. A worker that fails (or dies) fails the run:
this process prints Ray's error and exits 1 - unless `--max-failures N`
(Ray Train's `FailureConfig(max_failures=N)`): Ray then restarts every
worker, up to N times, and a script with `BackupAndRestore` resumes.
"""

import os
import runpy
import sys
import tempfile


def run_script(config):
    sys.argv = [config["script"]] + list(config["args"])
    runpy.run_path(config["script"], run_name="__main__")


def main():
    arguments = sys.argv[1:]
    max_failures = 0
    if arguments[0] == "--max-failures":
        max_failures, arguments = int(arguments[1]), arguments[2:]
    workers, script = int(arguments[0]), os.path.abspath(arguments[1])
    # Every worker line as printed: Ray folds lines that differ only in numbers ("rank 1 pid P
    # step 23 [repeated 68x]"), and tests wait for such lines.
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    ray.init(num_cpus=workers + 1, include_dashboard=False, logging_level="WARNING",
             runtime_env={"env_vars": {k: v for k, v in os.environ.items()
                                        if k.startswith(("TFDIST_", "TF_CPP"))}})
    trainer = TensorflowTrainer(
        run_script,
        train_loop_config={"script": script, "args": arguments[2:]},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=False),
        run_config=RunConfig(storage_path=tempfile.mkdtemp(prefix="tfdist-ray-"),
                             failure_config=FailureConfig(max_failures=max_failures)),
    )
    try:
        trainer.fit()
    except Exception as error:  # pylint: disable=broad-except
        print(f"ray_train_job: the Ray Train run failed: {type(error).__name__}: {error}",
              flush=True)
        return 1
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
