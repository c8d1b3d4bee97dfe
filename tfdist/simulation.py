"""P ranks of one job as P threads of this process: strategies, Keras and all, in seconds.

`simulate_processes(world_size, fn)` runs `fn(rank)` in one thread per
rank, each thread bound to its rank's simulated communicator
(`tfdist.comm.simulated`) through `tfdist.runtime.use_communicator`: the
strategies `fn` builds take that communicator and rank, whatever engine
they name, so Keras' `fit`/`evaluate`/`predict`, custom `train_step`s and
custom loops run with tfdist's real patches and aggregation algorithms
(ring, reduction tree) at P ranks, compared with one rank in the same
process. Only the transport is simulated; the parameter server's servers
are processes and are not.

What threads share and processes do not is made per-thread where training
reads it: Python's and NumPy's global random generators
(`comm.thread_random_state`). TensorFlow's global seed and its eager
op-seed sequence stay process-wide, so a script whose ranks draw unseeded
eager random ops must run as processes. Python's cyclic garbage collector
runs on the calling thread while the ranks run, never inside a rank (a
collection that destroys a `tf.data` iterator can wait seconds for its
pipeline's threads, and would hold that rank alone). Compiled steps wait for their
peers on TensorFlow's inter-op threads: call
`tfdist.comm.simulated.reserve_inter_op_threads()` before TensorFlow
starts.

Cost: the ranks share the GIL, so a step's Python (tracing above all) runs
one rank at a time: a small Keras case takes 1-5 s at 2-5 ranks here,
about what one launch of processes costs to start.
"""

from typing import Callable, List, TypeVar

from tfdist import runtime
from tfdist.comm import thread_random_state
from tfdist.comm.simulated import DEFAULT_TIMEOUT_SECONDS, SimulatedCommunicator, simulate


Result = TypeVar("Result")


def simulate_processes(world_size: int, fn: Callable[[int], Result],
                       timeout: float = DEFAULT_TIMEOUT_SECONDS) -> List[Result]:
    """`[fn(rank) for each rank]`, each rank a thread bound to its simulated communicator.

    Raises `tfdist.comm.simulated.SimulationError` naming the first rank that
    raised (its exception chained), or when a wait exceeds `timeout` seconds.
    """
    def bound(communicator: SimulatedCommunicator) -> Result:
        with runtime.use_communicator(communicator):
            return fn(communicator.rank)

    with thread_random_state.per_thread():
        return simulate(world_size, bound, timeout)
