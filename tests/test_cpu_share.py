"""Processes sharing a host split TensorFlow's intra-op threads (`tfdist.process_setup.cpu_share`)."""

import pytest

from tfdist.process_setup import cluster, cpu_share


@pytest.mark.parametrize("local_size, usable, machine, expected", [
    (1, 8, 8, None),     # one process per host: TensorFlow's own pool
    (2, 8, 8, 4),
    (3, 8, 8, 2),
    (4, 2, 2, 1),        # more processes than CPUs: one thread each
    (2, 4, 8, None),     # affinity already a subset (bound by the launcher, a cpuset)
])
def test_threads_per_process(local_size, usable, machine, expected):
    assert cpu_share.intra_op_threads(local_size, {}, usable, machine) == expected


def test_a_users_choice_stands():
    assert cpu_share.intra_op_threads(2, {"TF_NUM_INTRAOP_THREADS": "8"}, 8, 8) is None
    assert cpu_share.intra_op_threads(2, {"TFDIST_INTRA_OP_THREADS": "0"}, 8, 8) is None
    assert cpu_share.intra_op_threads(1, {"TFDIST_INTRA_OP_THREADS": "3"}, 8, 8) == 3
    with pytest.raises(ValueError, match="TFDIST_INTRA_OP_THREADS must be an integer >= 0"):
        cpu_share.intra_op_threads(2, {"TFDIST_INTRA_OP_THREADS": "many"}, 8, 8)


def test_each_launcher_says_how_many_processes_share_the_host():
    tfdist_run = {"TFDIST_RANK": "1", "TFDIST_WORLD_SIZE": "2",
                  "TFDIST_WORKER_ADDRESSES": "127.0.0.1:1000,127.0.0.1:1001",
                  "TFDIST_SERVER_ADDRESSES": "127.0.0.1:2000"}
    assert cluster.discover(tfdist_run).local_size == 3  # the server shares the host too
    horovodrun = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_SIZE": "2"}
    assert cluster.discover(horovodrun).local_size == 2
    mpirun = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "6",
              "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}
    assert cluster.discover(mpirun).local_size == 3
    tf_config = ('{"cluster": {"worker": ["a:1", "a:2", "b:1"], "ps": ["a:3"]}, '
                 '"task": {"type": "worker", "index": 2}}')
    assert cluster.discover({"TF_CONFIG": tf_config}).local_size == 1
    assert cluster.discover({"TF_CONFIG": tf_config.replace('"index": 2', '"index": 0')}
                            ).local_size == 3
    assert cluster.discover({}).local_size == 1


@pytest.mark.parametrize("tasks_per_node, node, expected", [
    ("2(x3)", "n2", 2), ("3(x2),1", "n2", 3), ("3(x2),1", "n3", 1), ("4", "n1", 4),
])
def test_srun_tasks_on_this_node(tasks_per_node, node, expected):
    env = {"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "7",
           "SLURM_STEP_NUM_TASKS": "7", "SLURM_LOCALID": "0", "SLURM_STEP_NODELIST": "n[1-3]",
           "SLURM_STEP_TASKS_PER_NODE": tasks_per_node, "SLURMD_NODENAME": node,
           "TFDIST_RENDEZVOUS_HOST": node}
    assert cluster.discover(env).local_size == expected
