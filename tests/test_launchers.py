"""The cluster engines' own launchers run tfdist jobs unchanged: mpirun, srun, Ray Train.

Each test starts the real launcher on this machine - Open MPI's `mpirun`
(`make install` provides it), `srun` on the one-node Slurm that
`scripts/local_slurm.sh` starts, and Ray Train's `TensorflowTrainer` (the
`ray` extra) - around the same equivalence script the other launchers run,
and the training must match one process within 1e-4 (every rank bit-equal).
How each finds its peers: `tfdist.process_setup.cluster` (discovery) and
`tfdist.comm.address_exchange` (the workers' addresses). Killing a worker
under each launcher is in test_kill_matrix.
"""

import os
import socket

import pytest

from helpers import (failure_report, max_abs_difference, only_configs, require_launcher, run_job,
                     script)

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


@pytest.mark.slow  # make test runs mpirun (Horovod on MPI) in test_horovod_api.py
@pytest.mark.horovod
def test_mpirun_runs_the_horovod_backend_on_mpi(reference, tmp_path):
    # Under mpirun, "auto" picks Horovod when it is built with MPI (make install builds it so).
    require_launcher("mpirun")
    output, ranks = train("mpirun", 2, str(tmp_path / "run"))
    assert "launched by mpirun" in output and "backend horovod" in output
    assert_matches(reference, ranks)


@pytest.mark.slow  # make test-all (make test stays within 20 min: tests/tiers.py)
def test_mpirun_swaps_addresses_through_mpi_for_tf_collectives(reference, tmp_path):
    require_launcher("mpirun")
    output, ranks = train("mpirun", 3, str(tmp_path / "run"), "--backend", "collective")
    assert "launched by mpirun" in output and "backend collective" in output
    assert_matches(reference, ranks)


@pytest.mark.horovod  # the address store is Horovod's
@pytest.mark.parametrize("world", [pytest.param(2, marks=pytest.mark.slow), 3])
def test_srun_matches_one_process(reference, tmp_path, world):
    require_launcher("srun")
    output, ranks = train("srun", world, str(tmp_path / "run"))
    assert "launched by srun" in output and "backend collective" in output
    assert_matches(reference, ranks)


@pytest.mark.slow  # make test runs Ray Train in test_resume.py (ray-restarted: killed, restarted)
def test_ray_train_tensorflow_trainer_matches_one_process(reference, tmp_path):
    output, ranks = train("ray", 2, str(tmp_path / "run"))
    assert "launched by TF_CONFIG" in output
    assert_matches(reference, ranks)


@pytest.mark.slow  # make test-all (make test stays within 20 min: tests/tiers.py)
def test_mpirun_output_is_as_quiet_as_tfdist_run():
    # No TensorFlow start-up notice from any rank; Keras' warning once; the user's on each rank.
    # TFDIST_VERBOSE=1, the control: the same job prints both notices and warnings per rank.
    require_launcher("mpirun")
    outputs = {}
    for verbose in (None, "1"):
        done = run_job("mpirun", 2, [script("quiet_job.py")], timeout=300,
                       extra_env={"TF_CPP_MIN_LOG_LEVEL": None, "TFDIST_VERBOSE": verbose})
        assert done.returncode == 0, failure_report(done)
        outputs[verbose] = done.stdout + done.stderr
    keras_warning, own_warning = ("Do not pass an `input_shape`",
                                  "UserWarning: quiet_job: a warning of the user's own")
    loud, quiet = outputs["1"], outputs[None]
    assert loud.count("cpu_feature_guard") == 2 and loud.count(keras_warning) == 2, loud
    assert quiet.count("quiet_job rank") == 2
    assert "cpu_feature_guard" not in quiet and "absl::InitializeLog" not in quiet, quiet
    assert quiet.count(keras_warning) == 1, quiet
    assert quiet.count(own_warning) == 2, quiet


# --- the address store srun jobs swap addresses through (in-process, no peers needed) ------

@pytest.mark.horovod
def test_a_busy_rendezvous_port_is_a_clear_error():
    import socket  # pylint: disable=import-outside-toplevel

    from tfdist.process_setup.cluster import Cluster, Rendezvous  # pylint: disable=import-outside-toplevel
    from tfdist.comm.address_exchange import serve_store  # pylint: disable=import-outside-toplevel

    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        spec = Cluster(0, 2, launcher="srun", rendezvous=Rendezvous("localhost", port, "s"))
        with pytest.raises(RuntimeError, match="set TFDIST_RENDEZVOUS_PORT to a free port"):
            serve_store(port, spec)


@pytest.mark.horovod
def test_the_address_store_names_the_ranks_that_never_came():
    from tfdist.process_setup.cluster import Cluster, Rendezvous  # pylint: disable=import-outside-toplevel
    from tfdist.comm import address_exchange, launcher_channel  # pylint: disable=import-outside-toplevel
    from tfdist.comm.ports import pick_ports  # pylint: disable=import-outside-toplevel
    from tfdist.errors import ClusterError  # pylint: disable=import-outside-toplevel

    port = pick_ports(1, host="")[0]
    spec = Cluster(0, 3, launcher="srun", rendezvous=Rendezvous("localhost", port, "s"))
    server = address_exchange.serve_store(port, spec)
    try:
        with pytest.raises(TimeoutError, match="ranks 1, 2 sent nothing"):
            address_exchange.all_gather_strings(0, 3, "here:1", 0.5, ("localhost", port), "a")
        with pytest.raises(TimeoutError, match="rank 0 did not publish the list"):
            address_exchange.all_gather_strings(2, 3, "there:2", 0.5, ("localhost", port), "b")
        # A value that is not "host:port" (another program writing into the store) is refused.
        launcher_channel._Store(("localhost", port), "c", 1, 0, 1).put("1", "not an address")
        with pytest.raises(ClusterError, match="rank 1 sent 'not an address'"):
            address_exchange.all_gather_strings(0, 2, "here:1", 2.0, ("localhost", port), "c")
    finally:
        server.close()
    with pytest.raises(TimeoutError, match="did not answer within"):
        address_exchange.all_gather_strings(1, 3, "there:2", 0.5, ("localhost", port), "d")


def test_the_address_store_refuses_requests_without_the_jobs_secret(monkeypatch):
    """srun's store checks the job's secret: a stranger's request (no signature, or another
    job's secret) is refused and logged; the job's ranks go on."""
    import urllib.request  # pylint: disable=import-outside-toplevel
    import urllib.error  # pylint: disable=import-outside-toplevel

    from tfdist.process_setup.cluster import Cluster, Rendezvous  # pylint: disable=import-outside-toplevel
    from tfdist.comm import address_exchange  # pylint: disable=import-outside-toplevel
    from tfdist.comm.ports import pick_ports  # pylint: disable=import-outside-toplevel
    from tfdist.errors import ClusterError  # pylint: disable=import-outside-toplevel

    monkeypatch.setenv("TFDIST_SECRET", "the job's secret")
    port = pick_ports(1, host="")[0]
    spec = Cluster(0, 2, launcher="srun", rendezvous=Rendezvous("127.0.0.1", port, "s"),
                   local_size=2)
    server = address_exchange.serve_store(port, spec)
    try:
        for method, body in (("GET", None), ("PUT", b"evil:1")):
            request = urllib.request.Request(f"http://127.0.0.1:{port}/s/1", data=body,
                                             method=method)
            with pytest.raises(urllib.error.HTTPError, match="403"):
                urllib.request.urlopen(request, timeout=5)
        with socket.create_connection(("127.0.0.1", port)) as garbage:
            garbage.sendall(os.urandom(256))
        monkeypatch.setenv("TFDIST_SECRET", "another job's secret")
        with pytest.raises(ClusterError, match="refused this rank's request"):
            address_exchange.all_gather_strings(1, 2, "there:2", 2.0, ("127.0.0.1", port), "s")
        monkeypatch.setenv("TFDIST_SECRET", "the job's secret")  # the job's ranks go on
        import threading  # pylint: disable=import-outside-toplevel

        results = {}
        peer = threading.Thread(target=lambda: results.update(one=address_exchange.all_gather_strings(
            1, 2, "there:2", 10.0, ("127.0.0.1", port), "t")))
        peer.start()
        results["zero"] = address_exchange.all_gather_strings(0, 2, "here:1", 10.0,
                                                              ("127.0.0.1", port), "t")
        peer.join()
        assert results == {"zero": ["here:1", "there:2"], "one": ["here:1", "there:2"]}
    finally:
        server.close()


@pytest.mark.horovod
def test_ranks_swap_addresses_through_the_store_and_rank_0_closes_it():
    import threading  # pylint: disable=import-outside-toplevel

    from tfdist.process_setup.cluster import Cluster, Rendezvous  # pylint: disable=import-outside-toplevel
    from tfdist.comm import address_exchange  # pylint: disable=import-outside-toplevel
    from tfdist.comm.ports import pick_ports  # pylint: disable=import-outside-toplevel

    port = pick_ports(1, host="")[0]
    results = {}

    def rank(r):
        spec = Cluster(r, 3, launcher="srun", host=f"node{r}",
                       rendezvous=Rendezvous("localhost", port, "tfdist-7.0"))
        results[r] = address_exchange.exchange_worker_addresses(spec, 1000 + r)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (2, 1, 0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    expected = ["node0:1000", "node1:1001", "node2:1002"]
    assert results == {0: expected, 1: expected, 2: expected}
    import socket  # pylint: disable=import-outside-toplevel

    with socket.socket() as probe:  # the store is closed once every rank has the list
        assert probe.connect_ex(("localhost", port)) != 0
