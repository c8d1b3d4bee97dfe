"""Which GPU each process uses, decided before TensorFlow starts, under every launcher.

No machine here has a GPU TensorFlow can use, so the device lists are made
up: `gpu_placement.choose` takes them as arguments, and `place` is run
with TensorFlow's device functions replaced by recorders. The environments
are what each launcher sets (as in test_cluster.py).
"""

import json

import pytest

from tfdist.process_setup import cluster, gpu_placement

GPUS = [f"/physical_device:GPU:{i}" for i in range(4)]


def tfdist_run(rank, world=4, servers=()):
    return cluster.discover({
        "TFDIST_RANK": str(rank), "TFDIST_WORLD_SIZE": str(world),
        "TFDIST_WORKER_ADDRESSES": ",".join(f"127.0.0.1:{1000 + r}" for r in range(world)),
        "TFDIST_SERVER_ADDRESSES": ",".join(servers)})


def tf_config(workers, index, task_type="worker"):
    return cluster.discover({"TF_CONFIG": json.dumps({
        "cluster": {"worker": workers, "ps": ["ps0:1"]}, "task": {"type": task_type,
                                                                  "index": index}})})


SRUN_TASK = {"SLURM_JOB_ID": "22", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3",
             "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4",
             "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
             "SLURMD_NODENAME": "gpu08"}

LAUNCHERS = {
    # name: (cluster, environment beyond it, GPUs TensorFlow lists, expected GPU index)
    "tfdist-run rank 2 of 4": (tfdist_run(2), {}, GPUS, 2),
    "horovodrun local rank 1 of 2": (cluster.discover({
        "HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1",
        "HOROVOD_LOCAL_SIZE": "2"}), {}, GPUS[:2], 1),
    "mpirun local rank 3 of 4": (cluster.discover({
        "OMPI_COMM_WORLD_RANK": "7", "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}), {}, GPUS, 3),
    "srun local id 1 of 2": (cluster.discover(SRUN_TASK), {}, GPUS[:2], 1),
    # srun --gpus-per-task=1: Slurm narrowed CUDA_VISIBLE_DEVICES to this task's GPU.
    "srun --gpus-per-task": (cluster.discover(SRUN_TASK), {"CUDA_VISIBLE_DEVICES": "3"},
                             GPUS[:1], 0),
    # TF_CONFIG: the second worker on host b (workers 2 and 3 share it): local rank 1.
    "TF_CONFIG second task of its host": (tf_config(["a:1", "a:2", "b:1", "b:2"], 3), {},
                                          GPUS[:2], 1),
    # Kubernetes: one process per pod; the device plugin gives the pod its GPU.
    "kubernetes pod": (cluster.discover({
        "JOB_COMPLETION_INDEX": "1", "HOSTNAME": "train-1", "TFDIST_SERVICE": "train-workers",
        "TFDIST_NUM_PROCESSES": "3"}), {}, GPUS[:1], 0),
    "one process": (cluster.discover({}), {}, GPUS, 0),
}


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_each_launcher_gives_each_process_the_gpu_of_its_local_rank(name):
    spec, environ, physical, expected = LAUNCHERS[name]
    placement = gpu_placement.choose(spec, physical, physical, runtime_started=False,
                                     environ=environ)
    assert (placement.gpu, placement.narrow) == (expected, True), placement


def test_tf_config_derives_the_local_rank_from_the_host_names():
    workers = ["a:1", "a:2", "b:1", "b:2"]
    assert [(c.local_rank, c.local_size) for c in (tf_config(workers, i) for i in range(4))] \
        == [(0, 2), (1, 2), (0, 2), (1, 2)]


def test_a_parameter_server_hides_the_gpus_and_a_cpu_host_uses_the_cpu():
    server = tf_config(["a:1"], 0, task_type="ps")
    assert gpu_placement.choose(server, GPUS, GPUS, False, {}) == gpu_placement.Placement(
        None, True, "a parameter server computes on the CPU")
    placement = gpu_placement.choose(tfdist_run(1), [], [], False, {})
    assert (placement.gpu, placement.narrow, placement.why) == (None, False, "no GPU visible")


def test_more_processes_than_gpus_is_an_error_unless_sharing_is_asked_for():
    with pytest.raises(ValueError, match=r"4 training processes on this host but 2 GPU\(s\).*"
                                         r"TFDIST_SHARE_GPUS=1.*rank 3"):
        gpu_placement.choose(tfdist_run(3), GPUS[:2], GPUS[:2], False, {})
    shared = gpu_placement.choose(tfdist_run(3), GPUS[:2], GPUS[:2], False,
                                  {"TFDIST_SHARE_GPUS": "1"})
    assert (shared.gpu, shared.narrow) == (1, True) and "shared" in shared.why


def test_a_script_that_chose_its_devices_keeps_its_choice():
    # It made one GPU visible itself before the strategy: that one, left as it is.
    mine = gpu_placement.choose(tfdist_run(2), GPUS, GPUS[3:], False, {})
    assert (mine.gpu, mine.narrow, mine.why) == (3, False, "the script's choice")
    # TensorFlow's runtime started before the strategy: visibility cannot change any more.
    started = gpu_placement.choose(tfdist_run(2), GPUS, GPUS, True, {})
    assert (started.gpu, started.narrow) == (2, False) and "maps all 4 GPUs" in started.why


def test_place_narrows_visibility_with_memory_growth_and_says_which_device(monkeypatch,
                                                                            capsys):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from tfdist import _tf  # pylint: disable=import-outside-toplevel

    class Device:
        def __init__(self, name):
            self.name = name

    devices = [Device(name) for name in GPUS[:2]]
    calls = []
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind: devices)
    monkeypatch.setattr(tf.config, "get_visible_devices", lambda kind: devices)
    monkeypatch.setattr(tf.config, "set_visible_devices",
                        lambda chosen, kind: calls.append(("visible", [d.name for d in chosen])))
    monkeypatch.setattr(tf.config.experimental, "set_memory_growth",
                        lambda device, on: calls.append(("growth", device.name, on)))
    monkeypatch.setattr(_tf, "runtime_started", lambda: False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    placement = gpu_placement.place(tfdist_run(1, world=2))
    assert placement.gpu == 1
    assert calls == [("visible", [GPUS[1]]), ("growth", GPUS[1], True)]
    assert ("tfdist: rank 1 computes on GPU 1 (/physical_device:GPU:1): local rank 1 of 2 "
            "training process(es) on this host, 2 GPU(s)") in capsys.readouterr().out
    monkeypatch.setenv("TFDIST_GPU_PLACEMENT", "off")
    assert gpu_placement.place(tfdist_run(1, world=2)) is None


# --- where the collectives run, and with which TensorFlow implementation ---------------------

@pytest.mark.parametrize("device,kind,implementation,expected", [
    ("", "all_reduce", "auto", ("CPU", "ring")),
    ("/job:worker/replica:0/task:1/device:CPU:0", "all_reduce", "nccl", ("CPU", "ring")),
    ("/job:worker/replica:0/task:1/device:GPU:0", "all_reduce", "auto", ("GPU", "nccl")),
    ("/device:GPU:0", "all_reduce", "nccl", ("GPU", "nccl")),
    ("/device:GPU:0", "all_reduce", "ring", ("GPU", "ring")),
    ("/device:GPU:0", "all_gather", "auto", ("GPU", "ring")),
    ("/device:GPU:0", "broadcast", "auto", ("GPU", "ring")),
])
def test_collectives_run_where_their_inputs_are_with_nccl_for_gpu_all_reduce(
        device, kind, implementation, expected):
    from tfdist.comm.tf_collective import collective_placement  # pylint: disable=import-outside-toplevel

    placed, hint = collective_placement(1, device, kind, implementation)
    assert placed == f"/job:worker/replica:0/task:1/device:{expected[0]}:0"
    assert hint == expected[1]
    with pytest.raises(ValueError, match="implementation must be one of"):
        collective_placement(1, device, kind, "gloo")


def test_every_collective_of_host_tensors_runs_on_the_cpu_with_the_ring(monkeypatch):
    """The communicator's collectives, traced with TensorFlow's kernels replaced by recorders
    of the device and hint each was given: host tensors stay on this task's CPU, ring."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from tfdist import _tf  # pylint: disable=import-outside-toplevel
    from tfdist.comm import tf_collective  # pylint: disable=import-outside-toplevel
    from tfdist.comm.trace_counter import TraceStableCounter  # pylint: disable=import-outside-toplevel

    seen, subdivisions = [], []

    def recorder(name, returns):
        def record(*args, communication_hint, timeout, max_subdivs_per_device=None):
            del timeout
            seen.append((name, tf.identity(tf.constant(0)).device, communication_hint))
            subdivisions.append((name, args[0].shape.num_elements(), max_subdivs_per_device))
            return returns(*args)
        return record

    monkeypatch.setattr(_tf, "all_reduce_v2", recorder("all_reduce", lambda t, *rest: t))
    monkeypatch.setattr(_tf, "all_gather_v2", recorder(
        "all_gather", lambda t, size, *rest: tf.concat([t] * size, 0)))
    monkeypatch.setattr(_tf, "broadcast_send_v2", recorder("send", lambda t, *rest: t))
    monkeypatch.setattr(_tf, "broadcast_recv_v2", recorder(
        "recv", lambda shape, dtype, *rest: tf.zeros(shape, dtype)))
    communicator = object.__new__(tf_collective.CollectiveCommunicator)
    communicator.rank, communicator.world_size, communicator.timeout = 1, 2, 10.0
    communicator.device = tf_collective.task_name(1) + "/device:CPU:0"
    communicator.implementation, communicator._monitor = "auto", None
    communicator._keys = TraceStableCounter(tf_collective.FIRST_INSTANCE_KEY)

    @tf.function
    def collectives(x):
        return (communicator.all_reduce(x), communicator.all_gather(x),
                communicator.all_gather_equal(x), communicator.broadcast(x),
                communicator.send(x, 0, 7), communicator.recv([3], tf.float32, 0, 7))

    collectives.get_concrete_function(tf.TensorSpec([3], tf.float32))
    assert {name for name, _, _ in seen} == {"all_reduce", "all_gather", "send", "recv"}
    assert all(device == "/job:worker/replica:0/task:1/device:CPU:0" and hint == "ring"
               for _, device, hint in seen), seen
    # A host all-reduce of 16 MiB or more runs the ring in 16 pieces per device; smaller ones
    # (and shapes known only at run time) keep TensorFlow's default.
    subdivisions.clear()
    big = tf_collective.SUBDIVIDE_FROM_BYTES // 4
    for spec in (tf.TensorSpec([big], tf.float32), tf.TensorSpec([big - 1], tf.float32),
                 tf.TensorSpec([big // 2], tf.float64), tf.TensorSpec([None], tf.float32)):
        tf.function(communicator.all_reduce).get_concrete_function(spec)
    assert [s for name, _, s in subdivisions if name == "all_reduce"] == [
        tf_collective.RING_SUBDIVISIONS, -1, tf_collective.RING_SUBDIVISIONS, -1], subdivisions
    assert tf_collective.ring_subdivisions(tf.zeros([big]), "nccl") == -1
