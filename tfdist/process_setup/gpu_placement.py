"""One GPU per training process, chosen from the launcher's local rank before TensorFlow starts.

Why: TensorFlow maps every GPU it can see and, by default, reserves most of
each one's memory when its runtime starts. P processes on a P-GPU host that
each see every GPU grab memory on all of them, and two that pick by the same
index share one. Horovod's documentation pins each process before anything
else (`tf.config.set_visible_devices(gpus[local_rank], "GPU")`, memory growth
on); tfdist does it when the cluster is discovered (`runtime.cluster()`,
which a strategy's constructor calls before anything starts TensorFlow's
runtime), for every launcher.

The decision (`choose`: no TensorFlow, tested with device lists made up):

1. a parameter server computes nothing: no GPU;
2. no GPU visible to this process: the CPU;
3. the script chose already - it narrowed the GPUs with
   `tf.config.set_visible_devices`, or TensorFlow's runtime started before
   the strategy was made - its choice stands: the one visible GPU, or GPU
   `local_rank % visible` of several (then every process maps them all,
   which this says);
4. the launcher narrowed `CUDA_VISIBLE_DEVICES` to one GPU per process
   (Slurm `--gpus-per-task`, the Kubernetes device plugin, a wrapper script):
   that GPU;
5. otherwise GPU `local_rank` of the host's GPUs, where the local rank
   counts the training processes on this host (the launcher's: tfdist-run,
   horovodrun, mpirun, srun; TF_CONFIG's tasks on one host name; one per
   Kubernetes pod). More training processes on the host than GPUs is an
   error unless `TFDIST_SHARE_GPUS=1` asks for sharing (GPU
   `local_rank % GPUs`).

Applied (`place`): only the chosen GPU stays visible, with memory growth
on, before the runtime starts; every process says which device it uses in
one start-up line (`tfdist: rank R uses ...`). `TFDIST_GPU_PLACEMENT=off`
leaves TensorFlow's visibility alone.

Cost: none per step; one device listing at start-up.
"""

import dataclasses
import os
from typing import Optional, Sequence

from tfdist.env_vars import Foreign
from tfdist.process_setup import cluster as cluster_lib
from tfdist import env_vars

ENV_SHARE_GPUS = env_vars.SHARE_GPUS.name


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a process computes.

    Attributes:
        gpu: index into the process's physical GPU list of the GPU it uses,
            or None for the CPU.
        narrow: whether to make only that GPU visible (False: visibility is
            left as it is: the script's or the launcher's choice, or none).
        why: the reason, for the start-up line.
    """

    gpu: Optional[int]
    narrow: bool
    why: str


def training_processes_here(cluster) -> int:
    """Training processes on this host (parameter servers left out), at least 1: the workers
    of this host name where the addresses are known (tfdist-run, TF_CONFIG, Kubernetes), the
    launcher's local size otherwise (horovodrun, mpirun, srun; 1 for one process)."""
    known = cluster_lib.workers_on_this_host(cluster)
    return max(1, known if known is not None else cluster.local_size)


def choose(cluster, physical: Sequence[str], visible: Sequence[str], runtime_started: bool,
           environ=None) -> Placement:
    """This process's `Placement` (see the module docstring).

    Args:
        cluster: the process's `tfdist.process_setup.cluster.Cluster`.
        physical: names of the GPUs TensorFlow lists for this process (after
            `CUDA_VISIBLE_DEVICES`).
        visible: names of those the TensorFlow configuration leaves visible.
        runtime_started: whether TensorFlow's runtime already started.
        environ: the environment (default: os.environ).

    Raises:
        ValueError: more training processes on this host than GPUs, unless
            `TFDIST_SHARE_GPUS=1`.
    """
    environ = os.environ if environ is None else environ
    if cluster.is_server:
        return Placement(None, bool(physical) and not runtime_started,
                         "a parameter server computes on the CPU")
    if not physical:
        return Placement(None, False, "no GPU visible")
    if runtime_started or len(visible) < len(physical):
        if not visible:
            return Placement(None, False, "the script hid every GPU")
        index = physical.index(visible[cluster.local_rank % len(visible)])
        if len(visible) == 1:
            return Placement(index, False, "the script's choice")
        return Placement(index, False, f"local rank {cluster.local_rank}; TensorFlow started "
                                       f"before the strategy, so this process maps all "
                                       f"{len(visible)} GPUs")
    cuda = Foreign.CUDA_VISIBLE_DEVICES.get(environ)
    if len(physical) == 1 and cuda is not None:
        return Placement(0, True, f"CUDA_VISIBLE_DEVICES={cuda} (set by the launcher)")
    here = training_processes_here(cluster)
    if here > len(physical) and not env_vars.SHARE_GPUS.flag(environ):
        raise ValueError(
            f"tfdist: {here} training processes on this host but {len(physical)} GPU(s): start "
            f"at most {len(physical)} per host, narrow CUDA_VISIBLE_DEVICES per process, or set "
            f"{ENV_SHARE_GPUS}=1 to share the GPUs (memory growth on). (rank {cluster.rank}, "
            f"local rank {cluster.local_rank})")
    index = cluster.local_rank % len(physical)
    shared = f" (shared: {ENV_SHARE_GPUS}=1)" if here > len(physical) else ""
    return Placement(index, True, f"local rank {cluster.local_rank} of {here} training "
                                  f"process(es) on this host, {len(physical)} GPU(s){shared}")


def turned_off() -> bool:
    """`TFDIST_GPU_PLACEMENT=off` (or 0, none): TensorFlow's GPU visibility is left alone."""
    return (env_vars.GPU_PLACEMENT.get() or "").strip().lower() in ("off", "0", "none")


def place(cluster) -> Optional[Placement]:
    """Choose and apply this process's placement (before TensorFlow's runtime starts); print
    which GPU it computes on where the machine has GPUs (a rank's line each: they differ; on
    a CPU-only machine the strategy's one line says so). None when `TFDIST_GPU_PLACEMENT=off`."""
    if turned_off():
        return None
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from tfdist import _tf  # pylint: disable=import-outside-toplevel

    physical = tf.config.list_physical_devices("GPU")
    started = _tf.runtime_started()
    visible = tf.config.get_visible_devices("GPU")
    placement = choose(cluster, [d.name for d in physical], [d.name for d in visible], started)
    if placement.narrow:
        chosen = [physical[placement.gpu]] if placement.gpu is not None else []
        tf.config.set_visible_devices(chosen, "GPU")
        for gpu in chosen:
            tf.config.experimental.set_memory_growth(gpu, True)
    _placed[0] = placement
    if not physical:  # a CPU-only machine: the strategy's start-up line says "CPU"
        return placement
    who = (f"server {cluster.server_index}" if cluster.is_server else f"rank {cluster.rank}")
    device = ("the CPU" if placement.gpu is None
              else f"GPU {placement.gpu} ({physical[placement.gpu].name})")
    print(f"tfdist: {who} computes on {device}: {placement.why}", flush=True)
    return placement


_placed = [None]


def placed() -> Optional[Placement]:
    """This process's placement (`place`'s), or None when none was made."""
    return _placed[0]
