"""Run a tfdist training script under Ray Train's `TensorflowTrainer`, unchanged.

    python ray_train_job.py [--max-failures N] [--elastic MIN MAX CONTROL_DIR]
                            NUM_WORKERS SCRIPT [SCRIPT ARGS ...]

Starts a local Ray cluster, and a `TensorflowTrainer` with NUM_WORKERS workers
whose training function runs SCRIPT as `__main__` (with SCRIPT ARGS as its
argv). Ray sets TF_CONFIG in each worker before the function runs, which is
how tfdist finds its peers there. A worker that fails (or dies) fails the run:
this process prints Ray's error and exits 1 - unless `--max-failures N`
(Ray Train's `FailureConfig(max_failures=N)`): Ray then restarts every
worker, up to N times, and a script with `BackupAndRestore` resumes.

`--elastic MIN MAX CONTROL_DIR`: Ray Train's elastic training,
`ScalingConfig(num_workers=(MIN, MAX))`, on Ray's local multi-node cluster
(`ray.cluster_utils.Cluster`): a head node without CPUs and NUM_WORKERS nodes
of one CPU each, so the nodes are the capacity. A test takes a node away by
creating CONTROL_DIR/remove (its worker dies with it; Ray restarts the group
with the workers the nodes left hold) and gives one back with
CONTROL_DIR/add (Ray resizes the group at its next look,
`elastic_resize_monitor_interval_s`); each file is consumed.
"""

import os
import runpy
import sys
import tempfile
import threading


def run_script(config):
    sys.argv = [config["script"]] + list(config["args"])
    runpy.run_path(config["script"], run_name="__main__")


def control_nodes(cluster, control_dir, done):
    """Until `done`: remove or add a one-CPU node when the test asks (CONTROL_DIR/remove, /add).
    On the main thread: a Ray node installs signal handlers when it starts."""
    nodes = list(cluster.worker_nodes)
    while not done.wait(0.2):
        for action in ("remove", "add"):
            path = os.path.join(control_dir, action)
            if not os.path.exists(path):
                continue
            os.remove(path)
            if action == "remove":
                cluster.remove_node(nodes.pop(), allow_graceful=False)
            else:
                nodes.append(cluster.add_node(num_cpus=1))
            print(f"ray_train_job: {'removed' if action == 'remove' else 'added'} a node; "
                  f"{len(nodes)} worker node(s)", flush=True)


def main():
    arguments = sys.argv[1:]
    max_failures, elastic = 0, None
    while arguments[0].startswith("--"):
        if arguments[0] == "--max-failures":
            max_failures, arguments = int(arguments[1]), arguments[2:]
        elif arguments[0] == "--elastic":
            elastic, arguments = (int(arguments[1]), int(arguments[2]), arguments[3]), \
                arguments[4:]
    workers, script = int(arguments[0]), os.path.abspath(arguments[1])
    # Every worker line as printed: Ray folds lines that differ only in numbers ("rank 1 pid P
    # step 23 [repeated 68x]"), and tests wait for such lines.
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    runtime_env = {"env_vars": {k: v for k, v in os.environ.items()
                                if k.startswith(("TFDIST_", "TF_CPP"))}}
    cluster, stop = None, threading.Event()
    if elastic is None:
        ray.init(num_cpus=workers + 1, include_dashboard=False, logging_level="WARNING",
                 runtime_env=runtime_env)
        scaling = ScalingConfig(num_workers=workers, use_gpu=False)
    else:
        from ray.cluster_utils import Cluster

        # A removed node's resources are still counted for a moment: Ray's first try at the
        # old size waits this long for workers that cannot be placed (60 s by default).
        os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "30")
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        for _ in range(workers):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, include_dashboard=False, logging_level="WARNING",
                 runtime_env=runtime_env)
        scaling = ScalingConfig(num_workers=elastic[:2], use_gpu=False,
                                elastic_resize_monitor_interval_s=2.0)
    trainer = TensorflowTrainer(
        run_script,
        train_loop_config={"script": script, "args": arguments[2:]},
        scaling_config=scaling,
        run_config=RunConfig(storage_path=tempfile.mkdtemp(prefix="tfdist-ray-"),
                             failure_config=FailureConfig(max_failures=max_failures)),
    )
    failed = []

    def fit():
        try:
            trainer.fit()
        except Exception as error:  # pylint: disable=broad-except
            failed.append(error)
        finally:
            stop.set()

    try:
        if cluster is None:
            fit()
        else:  # the nodes are controlled from the main thread, the run from another
            threading.Thread(target=fit, daemon=True).start()
            control_nodes(cluster, elastic[2], stop)
        if failed:
            print(f"ray_train_job: the Ray Train run failed: {type(failed[0]).__name__}: "
                  f"{failed[0]}", flush=True)
            return 1
    finally:
        stop.set()
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
