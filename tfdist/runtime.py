"""Process-wide state: this process's cluster and its communicator.

A TensorFlow server can be started once per process, so the communicator is
created once (on first use) and shared by every strategy the process builds.
Kept apart from the user-facing strategies, as HF Accelerate keeps `state.py`
apart from `accelerator.py`.
"""

import threading

from tfdist import cluster as cluster_lib

_lock = threading.Lock()
_cluster = None
_communicator = None


def cluster():
    """This process's `tfdist.cluster.Cluster` (discovered once)."""
    global _cluster
    with _lock:
        if _cluster is None:
            _cluster = cluster_lib.discover()
        return _cluster


def communicator():
    """The process-wide `CollectiveCommunicator`, or None for a single process."""
    global _communicator
    spec = cluster()
    if spec.world_size == 1:
        return None
    with _lock:
        if _communicator is None:
            if not spec.worker_addresses:
                raise NotImplementedError(
                    f"tfdist: launched by {spec.launcher} without worker addresses; "
                    "TensorFlow collectives need them (use tfdist-run or TF_CONFIG)."
                )
            from tfdist.comm.tf_collective import CollectiveCommunicator

            _communicator = CollectiveCommunicator(spec)
        return _communicator
