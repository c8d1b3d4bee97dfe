"""Jobs across hosts: two emulated machines, each its own address, host name and disk.

Each host is a network namespace on a bridge (`benchmarks.netns`), with a host name of its
own (a UTS namespace; every host's /etc/hosts names all of them) and a disk of its own (the
job's directory is a different directory on each host). The launchers reach the hosts as
they reach real ones: `mpirun -H` and `horovodrun -H` by ssh (`benchmarks.netns_ssh`, which
enters the host's namespaces), srun through a slurmd on each host, TF_CONFIG one process per
host. Checked:

* training matches one process within 1e-4, each rank's local rank is its host's;
* every rank saves (`model.save`, `save_weights`, `ModelCheckpoint`, `BackupAndRestore`) on
  its own disk and loads what it saved: each host has the chief's bytes, a stale file of
  the same name on the other host does not survive, and a job stopped mid-way resumes from
  the chief's backup exactly;
* a rank killed on the other host is named.

Needs root (network namespaces), as CI runs; skipped with the reason otherwise. make test
runs mpirun -H (the MPI engine over TCP) with the saves and the resume; make test-all the
other launchers (srun on a two-node Slurm of the emulated hosts, `benchmarks.netns_slurm`),
2x2, a killed rank and a cut link.
"""

import json
import os
import subprocess
import sys
import tempfile

import pytest

from helpers import REPO, failure_report, max_abs_difference, only_configs, script

TOLERANCE = 1e-4
CONFIGS = "adam,adam_tfdata"
HOSTS = ["mhost0", "mhost1"]
PORT = 23456


@pytest.fixture(scope="module")
def reference(one_process_run):
    return only_configs(one_process_run(), CONFIGS.split(","))


@pytest.fixture
def hosts(tmp_path):
    """Two emulated hosts; `tmp_path / "job"` is each host's own directory."""
    sys.path.insert(0, REPO)
    from benchmarks import netns  # pylint: disable=import-outside-toplevel
    from benchmarks.netns_ssh import install_ssh_shim  # pylint: disable=import-outside-toplevel

    try:
        netns.check_available()
    except netns.NetworkUnavailable as reason:
        pytest.skip(str(reason))
    job = tmp_path / "job"
    with netns.EmulatedNetwork(2, 1000, host_names=HOSTS, private_dirs=[str(job)],
                               scratch=str(tmp_path / "disks")) as network, \
            tempfile.TemporaryDirectory() as shim:
        install_ssh_shim(shim)
        network.job = str(job)
        network.env = _environment(PATH=f"{shim}:{os.path.dirname(sys.executable)}:"
                                        f"{os.environ.get('PATH', '')}",
                                   PYTHONPATH=REPO, **network.setup_environment())
        yield network


def _environment(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TFDIST_", "HOROVOD_", "OMPI_COMM_WORLD")) and k != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", TFDIST_TIMEOUT="60",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **extra)
    return env


def _launch(hosts, kind, per_host, args, timeout=400):
    """Run `python args...` on both hosts, `per_host` processes each, started by `kind`."""
    world = 2 * per_host
    slots = ",".join(f"{name}:{per_host}" for name in HOSTS)
    if kind == "mpirun":
        command = ["mpirun", "--allow-run-as-root", "-np", str(world), "-H", slots,
                   "--oversubscribe"] + [part for name in ("PATH", "PYTHONPATH", "TFDIST_TIMEOUT",
                                                           "TF_CPP_MIN_LOG_LEVEL")
                                         for part in ("-x", name)]
    elif kind == "horovodrun":
        command = [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "--gloo",
                   "--disable-cache", "--start-timeout", "120", "-np", str(world), "-H", slots]
    elif kind == "srun":
        command = ["srun", "-N", "2", "-n", str(world), f"--ntasks-per-node={per_host}"]
    elif kind == "tfdist-run":
        command = [sys.executable, "-m", "tfdist.launch", "-np", str(world), "-H", slots,
                   "--timeout", "60"]
    else:
        raise ValueError(kind)
    return subprocess.run(hosts.exec_prefix(0) + command + [sys.executable] + args,
                          env=hosts.env, capture_output=True, text=True, timeout=timeout)


def _tf_config(hosts, args, timeout=400):
    cluster = {"worker": [f"{name}:{PORT}" for name in HOSTS]}
    procs = [subprocess.Popen(
        hosts.exec_prefix(r) + [sys.executable] + args, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        env=dict(hosts.env, TF_CONFIG=json.dumps({"cluster": cluster,
                                                  "task": {"type": "worker", "index": r}})))
        for r in range(2)]
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outputs)
    return "\n".join(outputs)


def _equivalence(hosts, kind, per_host, reference, extra=()):
    import numpy as np  # pylint: disable=import-outside-toplevel

    prefix = os.path.join(hosts.job, "run")
    args = [script("train_equivalence.py"), prefix, "--configs", CONFIGS, *extra]
    if kind == "tf-config":
        output = _tf_config(hosts, args)
    else:
        done = _launch(hosts, kind, per_host, args)
        assert done.returncode == 0, failure_report(done)
        output = done.stdout + done.stderr
    world = 2 * per_host
    ranks = []
    for rank in range(world):  # each result on the disk of the host the rank ran on
        host = rank // per_host
        ranks.append(dict(np.load(os.path.join(hosts.own_dir(host, hosts.job),
                                               f"run.rank{rank}.npz"))))
    assert max_abs_difference(reference, ranks[0]) <= TOLERANCE
    for other in ranks[1:]:
        assert max_abs_difference(ranks[0], other) <= 1e-6
    return output


def _saves(hosts, launch, per_host=1):
    """Every rank saves on its own disk, a stopped run resumes: see the module docstring."""
    world = 2 * per_host
    stopped = launch([script("multi_host_saves.py"), hosts.job, "4", "--stop-after", "2"])
    assert stopped != 0  # it stopped itself after epoch 2, leaving the chief's backup
    assert os.path.isdir(os.path.join(hosts.own_dir(0, hosts.job), "backup"))
    assert launch([script("multi_host_saves.py"), hosts.job, "4"]) == 0
    results = []
    for rank in range(world):
        host = rank // per_host
        with open(os.path.join(hosts.own_dir(host, hosts.job), f"result.rank{rank}.json")) as f:
            results.append(json.load(f))
    assert [r["host"] for r in results] == [HOSTS[r // per_host] for r in range(world)]
    assert [r["local_rank"] for r in results] == [r % per_host for r in range(world)]
    for result in results:
        assert result["loaded_keras"] == 0.0 and result["loaded_h5"] == 0.0, result
        assert sorted(result["checkpoints"]) == [f"ckpt-{e}.keras" for e in range(1, 5)], result
        assert result["checkpoints"] == results[0]["checkpoints"], results
        assert result["sum"] == results[0]["sum"]
    for name in ("final.keras", "final.weights.h5"):
        chief, other = (open(os.path.join(hosts.own_dir(h, hosts.job), name), "rb").read()
                        for h in (0, 1))
        assert chief == other, name  # the chief's bytes on the other host's disk
    return results


def _plain_sum(tmp_path):
    """The same script as one plain process (no launcher): the resumed jobs must equal it."""
    directory = tmp_path / "plain"
    done = subprocess.run([sys.executable, script("multi_host_saves.py"), str(directory), "4"],
                          env=_environment(PYTHONPATH=REPO), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(directory / "result.rank0.json") as f:
        return json.load(f)["sum"]


def test_mpirun_across_hosts_matches_one_process_and_saves_on_each_disk(hosts, reference,
                                                                        tmp_path):
    output = _equivalence(hosts, "mpirun", 1, reference)
    assert "launched by mpirun" in output and "ring on mpi" in output, output[-3000:]

    def launch(args):
        done = _launch(hosts, "mpirun", 1, args)
        print(done.stdout[-3000:], done.stderr[-3000:])  # shown if the test fails
        return done.returncode

    results = _saves(hosts, launch)
    assert abs(results[0]["sum"] - _plain_sum(tmp_path)) <= TOLERANCE


@pytest.mark.slow
def test_tf_config_across_hosts_matches_one_process_and_saves_on_each_disk(hosts, reference):
    _equivalence(hosts, "tf-config", 1, reference)

    def launch(args):
        try:
            _tf_config(hosts, args)
        except AssertionError:
            return 1
        return 0

    _saves(hosts, launch)


@pytest.mark.slow
@pytest.mark.horovod
def test_horovodrun_across_hosts_matches_one_process(hosts, reference):
    output = _equivalence(hosts, "horovodrun", 1, reference)
    assert "launched by horovodrun" in output


@pytest.mark.slow
def test_tfdist_run_across_hosts_two_per_host(hosts, reference):
    output = _equivalence(hosts, "tfdist-run", 2, reference)
    assert "launched by mpirun" in output

    def launch(args):
        return _launch(hosts, "tfdist-run", 2, args).returncode

    _saves(hosts, launch, per_host=2)


@pytest.mark.slow
def test_srun_across_hosts_matches_one_process_and_saves_on_each_disk(hosts, reference,
                                                                      tmp_path):
    """A two-node Slurm on the emulated hosts (`benchmarks.netns_slurm`): rank 0 serves the
    address store on the step's first node."""
    from benchmarks import netns_slurm  # pylint: disable=import-outside-toplevel

    try:
        slurm = netns_slurm.EmulatedSlurm(hosts, str(tmp_path / "slurm")).__enter__()
    except netns_slurm.SlurmUnavailable as reason:
        if os.environ.get("TFDIST_REQUIRE_SLURM"):
            raise
        pytest.skip(str(reason))
    try:
        hosts.env = slurm.env(hosts.env)
        output = _equivalence(hosts, "srun", 1, reference)
        assert "launched by srun" in output

        def launch(args):
            return _launch(hosts, "srun", 1, args).returncode

        _saves(hosts, launch)
    finally:
        slurm.close()


@pytest.mark.slow
def test_a_rank_killed_on_the_other_host_is_named(hosts):
    """Rank 1 (on mhost1) dies in the middle of training: rank 0 names it and the job ends."""
    done = _launch(hosts, "tfdist-run", 1, [script("failure_modes.py"), "crash"],
                   timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "rank 1" in output and ("is gone" in output or "exited with code" in output), \
        output[-3000:]


@pytest.mark.slow
def test_a_cut_link_is_said_as_unreachable(hosts):
    """The link to the other host goes down mid-training (TF_CONFIG, TensorFlow's
    collectives): rank 0 says its peer is unreachable - not that it died - within seconds."""
    cluster = {"worker": [f"{name}:{PORT}" for name in HOSTS]}
    procs = [subprocess.Popen(
        hosts.exec_prefix(r) + [sys.executable, script("failure_modes.py"), "slow"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(hosts.env, TF_CONFIG=json.dumps({"cluster": cluster,
                                                  "task": {"type": "worker", "index": r}})))
        for r in range(2)]
    try:
        lines = []
        for line in procs[0].stdout:  # until training is under way
            lines.append(line)
            if "epoch 1 started" in line:
                break
        subprocess.run(["ip", "netns", "exec", hosts.namespace(1), "ip", "link", "set", "eth0",
                        "down"], check=True)
        output = "".join(lines) + procs[0].communicate(timeout=120)[0]
    finally:
        for proc in procs:
            proc.kill()
    assert procs[0].returncode != 0
    assert (f"peer rank 1 ({HOSTS[1]}:{PORT}) is unreachable (its host does not answer: the "
            "host is down or the network link to it is cut)") in output, output[-3000:]
