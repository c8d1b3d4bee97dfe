"""Cluster discovery: tfdist-run, horovodrun, TF_CONFIG, mpirun, srun, Kubernetes, single process."""

import json

import pytest

from tfdist.process_setup import cluster
from tfdist.process_setup.slurm_hostlist import expand_hostlist, first_host


def tf_config(cluster_spec, task_type, index):
    return json.dumps({"cluster": cluster_spec, "task": {"type": task_type, "index": index}})


def test_single_process_without_environment():
    c = cluster.discover({})
    assert (c.rank, c.world_size, c.launcher, c.is_chief) == (0, 1, "single", True)
    assert c.timeout == cluster.DEFAULT_TIMEOUT_SECONDS


def test_tfdist_run_environment():
    env = {
        "TFDIST_RANK": "2", "TFDIST_WORLD_SIZE": "3", "TFDIST_TIMEOUT": "42",
        "TFDIST_WORKER_ADDRESSES": "127.0.0.1:1000,127.0.0.1:1001,127.0.0.1:1002",
        "TFDIST_SERVER_ADDRESSES": "127.0.0.1:2000",
    }
    c = cluster.discover(env)
    assert (c.rank, c.world_size, c.launcher, c.timeout) == (2, 3, "tfdist-run", 42.0)
    assert c.worker_addresses[2] == "127.0.0.1:1002"
    assert c.server_addresses == ("127.0.0.1:2000",)
    assert not c.is_chief


def test_tfdist_run_server_role():
    env = {"TFDIST_ROLE": "server", "TFDIST_SERVER_INDEX": "0", "TFDIST_WORLD_SIZE": "1",
           "TFDIST_SERVER_ADDRESSES": "127.0.0.1:2000"}
    c = cluster.discover(env)
    assert c.is_server and c.server_index == 0 and not c.is_chief


def test_tfdist_run_takes_precedence_over_tf_config():
    env = {"TFDIST_RANK": "0", "TFDIST_WORLD_SIZE": "1",
           "TF_CONFIG": tf_config({"worker": ["a:1", "b:2"]}, "worker", 1)}
    assert cluster.discover(env).launcher == "tfdist-run"


def test_horovodrun_environment():
    c = cluster.discover({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1"})
    assert (c.rank, c.world_size, c.local_rank, c.launcher) == (1, 4, 1, "horovodrun")


@pytest.mark.parametrize("task_type,index,rank,role", [
    ("chief", 0, 0, "worker"),
    ("worker", 0, 1, "worker"),
    ("worker", 1, 2, "worker"),
    ("ps", 1, 0, "server"),
])
def test_tf_config_roles_and_ranks(task_type, index, rank, role):
    spec = {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1", "p:2"]}
    c = cluster.discover({"TF_CONFIG": tf_config(spec, task_type, index)})
    assert (c.rank, c.role, c.world_size) == (rank, role, 3)
    assert c.worker_addresses == ("c:1", "w:1", "w:2")
    assert c.server_addresses == ("p:1", "p:2")
    assert c.launcher == "TF_CONFIG"


def test_tf_config_without_chief_makes_worker_zero_the_chief():
    c = cluster.discover({"TF_CONFIG": tf_config({"worker": ["w:1", "w:2"]}, "worker", 0)})
    assert c.is_chief and c.world_size == 2


@pytest.mark.parametrize("text,field", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    (json.dumps({"task": {"type": "worker", "index": 0}}), "TF_CONFIG['cluster']"),
    (json.dumps({"cluster": {"worker": ["a:1"]}}), "TF_CONFIG['task']"),
    (tf_config({"worker": ["a:1"]}, "chief", 0), "TF_CONFIG['task']['type']"),
    (tf_config({"worker": ["a:1"]}, "worker", 3), "TF_CONFIG['task']['index']=3"),
    (tf_config({"worker": ["a:1"]}, "worker", "0"), "TF_CONFIG['task']['index']"),
    (tf_config({"worker": ["a:1", "nocolon"]}, "worker", 0), "TF_CONFIG['cluster']['worker'][1]"),
    (tf_config({"worker": ["a:1", "a:99999"]}, "worker", 0), "invalid address"),
    (tf_config({"worker": ["a:1", "a:1"]}, "worker", 0), "repeats address"),
    (tf_config({"worker": "a:1"}, "worker", 0), "non-empty list"),
    (tf_config({"chief": ["a:1", "b:2"]}, "chief", 0), "exactly one task"),
    (tf_config({"trainer": ["a:1"]}, "trainer", 0), "unknown job 'trainer'"),
    (tf_config({"ps": ["a:1"]}, "ps", 0), "nobody trains"),
    (tf_config({"worker": ["a:1"], "evaluator": ["e:1"]}, "evaluator", 0), "evaluator"),
])
def test_malformed_tf_config_names_the_field(text, field):
    with pytest.raises(ValueError) as error:
        cluster.discover({"TF_CONFIG": text})
    assert field in str(error.value)


@pytest.mark.parametrize("env,message", [
    ({"TFDIST_RANK": "x", "TFDIST_WORLD_SIZE": "2", "TFDIST_WORKER_ADDRESSES": "a:1,a:2"},
     "TFDIST_RANK must be an integer"),
    ({"TFDIST_RANK": "2", "TFDIST_WORLD_SIZE": "2",
      "TFDIST_WORKER_ADDRESSES": "a:1,a:2"}, "out of range"),
    ({"TFDIST_RANK": "0", "TFDIST_WORLD_SIZE": "2",
      "TFDIST_WORKER_ADDRESSES": "a:1"}, "lists 1 addresses"),
    ({"TFDIST_TIMEOUT": "-1"}, "must be positive"),
])
def test_bad_tfdist_environment(env, message):
    with pytest.raises(ValueError, match=message):
        cluster.discover(env)


# --- the cluster engines' launchers: mpirun, srun, Kubernetes Indexed Jobs -----------------

SRUN_TASK = {  # what srun -n 3 sets in task 1 (a Slurm 22.05 step; trimmed)
    "SLURM_JOB_ID": "22", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "3", "SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURMD_NODENAME": "gpu07",
}


def test_open_mpi_environment():
    c = cluster.discover({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3",
                          "OMPI_COMM_WORLD_LOCAL_RANK": "0", "TFDIST_HOST": "node7"})
    assert (c.rank, c.world_size, c.local_rank, c.launcher, c.host) == (2, 3, 0, "mpirun",
                                                                         "node7")
    assert c.worker_addresses == ()  # swapped through MPI when the transport starts


def test_srun_step_environment_and_rendezvous():
    c = cluster.discover(SRUN_TASK)
    assert (c.rank, c.world_size, c.local_rank, c.launcher, c.host) == (1, 3, 1, "srun", "gpu07")
    assert c.rendezvous == ("gpu07", cluster.rendezvous_port(22, 0), "tfdist-22.0")
    assert cluster.RENDEZVOUS_PORT_BASE <= cluster.rendezvous_port(22, 0) < 30000
    assert cluster.rendezvous_port(22, 1) != cluster.rendezvous_port(22, 0)
    c = cluster.discover(dict(SRUN_TASK, TFDIST_RENDEZVOUS_PORT="4567", SLURM_STEP_ID="3"))
    assert c.rendezvous == ("gpu07", 4567, "tfdist-22.3")  # each step its own scope
    c = cluster.discover(dict(SRUN_TASK, TFDIST_RENDEZVOUS_HOST="gpu08", TFDIST_HOST="ib-gpu07"))
    assert (c.rendezvous.host, c.host) == ("gpu08", "ib-gpu07")


def test_srun_task_0_off_the_first_host_is_named():
    task0 = dict(SRUN_TASK, SLURM_PROCID="0", SLURM_LOCALID="0", SLURMD_NODENAME="gpu08")
    with pytest.raises(ValueError, match="task 0 runs on gpu08, not on gpu07"):
        cluster.discover(task0)
    assert cluster.discover(dict(task0, TFDIST_RENDEZVOUS_HOST="gpu08")).rank == 0


def test_a_batch_script_or_salloc_shell_is_not_a_job_step():
    # sbatch's shell has SLURM_PROCID=0 and the job's SLURM_NTASKS, but no step: one process.
    batch = {"SLURM_JOB_ID": "23", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}
    assert cluster.discover(batch).launcher == "single"


def test_sources_are_tried_in_order():
    # mpirun inside a Slurm allocation: the MPI ranks, not the allocation's shell.
    mpi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
    assert cluster.discover(dict(SRUN_TASK, **mpi)).launcher == "mpirun"
    # Ray Train on Slurm nodes: Ray's TF_CONFIG, not the srun step that started Ray.
    tf_config = json.dumps({"cluster": {"worker": ["a:1", "b:2"]},
                            "task": {"type": "worker", "index": 1}})
    assert cluster.discover(dict(SRUN_TASK, TF_CONFIG=tf_config)).launcher == "TF_CONFIG"


@pytest.mark.parametrize("text, hosts", [
    ("gpu07", ["gpu07"]),
    ("gpu[07-09,11],login", ["gpu07", "gpu08", "gpu09", "gpu11", "login"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
])
def test_slurm_host_lists_expand(text, hosts):
    assert expand_hostlist(text) == hosts
    assert first_host(text) == hosts[0]


def test_the_first_host_is_read_without_expanding_the_rest():
    assert first_host("n[0005-9999999999],login") == "n0005"


@pytest.mark.parametrize("text", ["gpu[07-09", "gpu07]", "gpu[a-b]", "", "gpu[[1]]",
                                  "a,n[5-3]", "x]y[1]"])
def test_malformed_slurm_host_lists_are_named(text):
    with pytest.raises(ValueError, match="host list"):
        expand_hostlist(text)
    with pytest.raises(ValueError, match="host list"):
        first_host(text)


@pytest.mark.parametrize("environ, message", [
    (dict(SRUN_TASK, SLURM_PROCID="3"), "SLURM_PROCID=3 is out of range"),
    (dict(SRUN_TASK, TFDIST_RENDEZVOUS_PORT="99999"), "TFDIST_RENDEZVOUS_PORT must be a port"),
    (dict(SRUN_TASK, TFDIST_NUM_SERVERS="1"), "under srun every process trains"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "TFDIST_NUM_SERVERS": "2"},
     "under mpirun every process trains"),
    ({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"},
     "OMPI_COMM_WORLD_RANK must be an integer"),
    ({k: v for k, v in SRUN_TASK.items() if k != "SLURM_STEP_NUM_TASKS"},
     "SLURM_STEP_NUM_TASKS is not set"),
    # MPICH's or Intel MPI's mpiexec: not read, refused rather than N single processes.
    ({"PMI_RANK": "1", "PMI_SIZE": "4"}, "an MPI launcher tfdist does not read"),
    (dict(SRUN_TASK, PMI_RANK="0", PMI_SIZE="3"), "an MPI launcher .* runs inside this job step"),
])
def test_bad_launcher_environments_are_named(environ, message):
    with pytest.raises(ValueError, match=message):
        cluster.discover(environ)


KUBERNETES_POD = {"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "train-1",
                  "TFDIST_SERVICE": "train-workers", "TFDIST_NUM_PROCESSES": "3"}


def test_kubernetes_indexed_job_environment():
    c = cluster.discover(KUBERNETES_POD)
    assert (c.rank, c.world_size, c.launcher) == (1, 3, "kubernetes")
    assert c.worker_addresses == ("train-0.train-workers:2222", "train-1.train-workers:2222",
                                  "train-2.train-workers:2222")
    c = cluster.discover(dict(KUBERNETES_POD, TFDIST_PORT="7000", TFDIST_JOB_NAME="bert",
                              HOSTNAME="whatever"))
    assert c.worker_addresses[2] == "bert-2.train-workers:7000"
    # An Indexed Job without the Service (a sweep of single-process jobs) is not a cluster.
    assert cluster.discover({"JOB_COMPLETION_INDEX": "4"}).launcher == "single"


@pytest.mark.parametrize("environ, message", [
    ({k: v for k, v in KUBERNETES_POD.items() if k != "TFDIST_NUM_PROCESSES"},
     "TFDIST_NUM_PROCESSES is not"),
    (dict(KUBERNETES_POD, HOSTNAME="train-abcde"), "set TFDIST_JOB_NAME"),
    (dict(KUBERNETES_POD, JOB_COMPLETION_INDEX="3"), "out of range"),
    ({k: v for k, v in KUBERNETES_POD.items() if k != "TFDIST_SERVICE"},
     "TFDIST_NUM_PROCESSES is set but TFDIST_SERVICE is not"),
    (dict(KUBERNETES_POD, TFDIST_NUM_SERVERS="1"), "every process trains"),
])
def test_bad_kubernetes_environments_are_named(environ, message):
    with pytest.raises(ValueError, match=message):
        cluster.discover(environ)


def test_the_kubernetes_example_describes_a_cluster_tfdist_discovers():
    """examples/kubernetes/tfdist-job.yaml: each pod's environment gives every peer's address."""
    import os  # pylint: disable=import-outside-toplevel

    import yaml  # pylint: disable=import-outside-toplevel

    path = os.path.join(os.path.dirname(__file__), "..", "examples", "kubernetes",
                        "tfdist-job.yaml")
    with open(path) as f:
        documents = {d["kind"]: d for d in yaml.safe_load_all(f)}
    service, job = documents["Service"], documents["Job"]
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    size = job["spec"]["completions"]
    name, service_name = job["metadata"]["name"], service["metadata"]["name"]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["parallelism"] == size
    assert service["spec"]["clusterIP"] == "None" and pod["subdomain"] == service_name
    assert service["spec"]["selector"] == {"job-name": name}
    port = container["ports"][0]["containerPort"]
    expected = tuple(f"{name}-{i}.{service_name}:{port}" for i in range(size))
    for index in range(size):  # what Kubernetes adds to each pod's environment
        c = cluster.discover(dict(env, JOB_COMPLETION_INDEX=str(index),
                                  HOSTNAME=f"{name}-{index}"))
        assert (c.rank, c.world_size, c.launcher) == (index, size, "kubernetes")
        assert c.worker_addresses == expected
