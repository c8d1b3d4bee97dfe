"""The cluster engines' own launchers run tfdist jobs unchanged: mpirun, srun, Ray Train.

Each test starts the real launcher on this machine - Open MPI's `mpirun`
(`make install` provides it), `srun` on the one-node Slurm that
`scripts/local_slurm.sh` starts, and Ray Train's `TensorflowTrainer` (the
`ray` extra) - around the same equivalence script the other launchers run,
and the training must match one process within 1e-4 (every rank bit-equal).
How each finds its peers: `tfdist.cluster` (discovery) and
`tfdist.comm.address_exchange` (the workers' addresses). Killing a worker
under each launcher is in test_kill_matrix.
"""

import os
import shutil
import subprocess

import pytest

from helpers import failure_report, max_abs_difference, only_configs, run_job, script

TOLERANCE = 1e-4
CONFIGS = "adam,adam_tfdata"  # the latter: shuffled tf.data, steps_per_execution=2


@pytest.fixture(scope="module")
def reference(one_process_run):
    return only_configs(one_process_run(), CONFIGS.split(","))


def train(kind, world, prefix, *options):
    done = run_job(kind, world, [script("train_equivalence.py"), prefix, "--configs", CONFIGS,
                                 *options], timeout=900)
    assert done.returncode == 0, failure_report(done)
    import numpy as np  # pylint: disable=import-outside-toplevel

    return done.stdout + done.stderr, [dict(np.load(f"{prefix}.rank{r}.npz")) for r in range(world)]


def assert_matches(reference, ranks):
    assert max_abs_difference(reference, ranks[0]) <= TOLERANCE
    for other in ranks[1:]:
        assert max_abs_difference(ranks[0], other) <= 1e-6


def require_slurm():
    """Skip unless a Slurm answers here (`scripts/local_slurm.sh` starts one; CI requires it)."""
    problem = None
    if shutil.which("srun") is None:
        problem = "srun is not installed (scripts/local_slurm.sh installs a one-node Slurm)"
    else:
        try:
            subprocess.run(["srun", "-n", "1", "true"], check=True, timeout=60,
                           capture_output=True)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            problem = f"srun does not run jobs here ({e}); start Slurm: scripts/local_slurm.sh"
    if problem:
        if os.environ.get("TFDIST_REQUIRE_SLURM"):
            pytest.fail(f"TFDIST_REQUIRE_SLURM is set but {problem}")
        pytest.skip(problem)


@pytest.mark.horovod
def test_mpirun_runs_the_horovod_backend_on_mpi(reference, tmp_path):
    # Under mpirun, "auto" picks Horovod when it is built with MPI (make install builds it so).
    output, ranks = train("mpirun", 2, str(tmp_path / "run"))
    assert "launched by mpirun" in output and "backend horovod" in output
    assert_matches(reference, ranks)


def test_mpirun_swaps_addresses_through_mpi_for_tf_collectives(reference, tmp_path):
    output, ranks = train("mpirun", 3, str(tmp_path / "run"), "--backend", "collective")
    assert "launched by mpirun" in output and "backend collective" in output
    assert_matches(reference, ranks)


@pytest.mark.parametrize("world", [2, 3])
def test_srun_matches_one_process(reference, tmp_path, world):
    require_slurm()
    output, ranks = train("srun", world, str(tmp_path / "run"))
    assert "launched by srun" in output and "backend collective" in output
    assert_matches(reference, ranks)


def test_ray_train_tensorflow_trainer_matches_one_process(reference, tmp_path):
    output, ranks = train("ray", 2, str(tmp_path / "run"))
    assert "launched by TF_CONFIG" in output
    assert_matches(reference, ranks)


# --- the address store srun jobs swap addresses through (in-process, no peers needed) ------

@pytest.mark.horovod
def test_a_busy_rendezvous_port_is_a_clear_error():
    import socket  # pylint: disable=import-outside-toplevel

    from tfdist.cluster import Cluster  # pylint: disable=import-outside-toplevel
    from tfdist.comm.address_exchange import serve_store  # pylint: disable=import-outside-toplevel

    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        spec = Cluster(0, 2, launcher="srun", rendezvous_address=f"localhost:{port}")
        with pytest.raises(RuntimeError, match="set TFDIST_RENDEZVOUS_PORT to a free port"):
            serve_store(port, spec)


@pytest.mark.horovod
def test_the_address_store_names_the_ranks_that_never_came():
    from tfdist.cluster import Cluster  # pylint: disable=import-outside-toplevel
    from tfdist.comm import address_exchange  # pylint: disable=import-outside-toplevel
    from tfdist.comm.ports import pick_ports  # pylint: disable=import-outside-toplevel

    port = pick_ports(1, host="")[0]
    spec = Cluster(0, 3, launcher="srun", rendezvous_address=f"localhost:{port}")
    server = address_exchange.serve_store(port, spec)
    try:
        with pytest.raises(TimeoutError, match=r"ranks \[1, 2\] did not publish"):
            address_exchange.all_gather_strings(0, 3, "here:1", 0.5, "localhost", port)
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(TimeoutError, match="did not answer within"):
        address_exchange.all_gather_strings(1, 3, "there:2", 0.5, "localhost", port)


def test_mpirun_output_is_as_quiet_as_tfdist_run():
    # No TensorFlow start-up notice from any rank; Keras' warning once; the user's on each rank.
    done = run_job("mpirun", 2, [script("quiet_job.py")], timeout=300,
                   extra_env={"TF_CPP_MIN_LOG_LEVEL": None})
    output = done.stdout + done.stderr
    assert done.returncode == 0, failure_report(done)
    assert output.count("quiet_job rank") == 2
    assert "cpu_feature_guard" not in output and "absl::InitializeLog" not in output, output
    assert output.count("Do not pass an `input_shape`") == 1, output
    assert output.count("UserWarning: quiet_job: a warning of the user's own") == 2, output
