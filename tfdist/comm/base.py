"""The `Communicator` protocol: what every engine adapter offers the layers above it.

Aggregation algorithms and strategies talk to the other processes only
through these methods, whichever engine carries them: TensorFlow's
collective ops (`tf_collective`), Horovod (`horovod`), or nothing at all
(`single_process`: one process, every collective is the identity). So no
caller asks "is there a communicator" or "can it do X" by probing
attributes: it asks the protocol (`supports_point_to_point`,
`fuses_tensors`), and an engine without a capability raises an error that
names the engine.

Collectives work in eager mode and inside `tf.function` alike, and every
rank must issue the same collectives in the same order (ranks running the
same script do). Tensors are summed element-wise (`all_reduce`), concatenated
along axis 0 in rank order (`all_gather`, rows may differ per rank), or
copied from a root (`broadcast`).

Liveness (`tfdist.comm.liveness`): a communicator notices peers that are
gone while this process waits on them and fails the wait with a message
naming the peer; `expect_progress` bounds one call of a compiled function
whose collectives carry no timeout of their own; `stop_watching` ends that
watch at the end of a job (peers finishing first are no failure).
"""

import abc
import contextlib
from typing import Any, ContextManager, List, Sequence, Tuple

import tensorflow as tf

from tfdist.errors import ClusterError


class Communicator(abc.ABC):
    """Collectives among the training processes of one job.

    Attributes:
        rank: this process's index, 0 .. world_size - 1 (0 is the chief).
        world_size: number of training processes P.
        engine: the engine's name ("collective", "horovod", "single-process").
        fuses_tensors: True if `grouped_all_reduce` packs its tensors into
            buffers itself (Horovod's tensor fusion); algorithms then hand the
            whole group to the engine instead of fusing it first.
        supports_point_to_point: True if `send` / `recv` are available.
        reduces_scatter: True if `reduce_scatter` is available (Horovod's engine;
            TensorFlow's `CollectiveReduceScatterV2` has no CPU implementation: on
            CPU tensors it waits for ever, so the collective engine says False).
        small_all_reduce_is_cheap: True if an all-reduce of a few bytes inside a
            compiled step costs microseconds (Open MPI's), far less than one
            element-wise pass over a model's gradients; False where it costs about
            a millisecond (TensorFlow's gRPC collectives, Horovod's negotiation
            cycle). Steps on such an engine learn the global batch's row count
            first and weight losses rather than gradients (`row_accounting`).
        timeout: seconds any wait on the peers may last (the job timeout).
    """

    rank: int = 0
    world_size: int = 1
    timeout: float = 300.0
    engine: str = "abstract"
    fuses_tensors: bool = False
    supports_point_to_point: bool = False
    reduces_scatter: bool = False
    small_all_reduce_is_cheap: bool = False

    def _take_rank(self, said_by: str, rank: int, world_size: int, cluster: Any,
                   how_to_start: str) -> None:
        """Take the rank and size the engine (`said_by`) gives this process, which must be the
        cluster environment's: a process started by another launcher fails, naming both."""
        self.rank, self.world_size = rank, world_size
        if (rank, world_size) != (cluster.rank, cluster.world_size):
            raise ClusterError(
                f"tfdist: {said_by} says rank {rank} of {world_size} but the cluster "
                f"environment says rank {cluster.rank} of {cluster.world_size}; {how_to_start}")

    # ---------------------------------------------------------- collectives
    @abc.abstractmethod
    def all_reduce(self, tensor: tf.Tensor) -> tf.Tensor:
        """Element-wise sum of `tensor` over all ranks (every rank gets it)."""

    def grouped_all_reduce(self, tensors: Sequence[tf.Tensor]) -> List[tf.Tensor]:
        """Element-wise sums of several tensors (one `all_reduce` each unless the engine groups)."""
        return [self.all_reduce(tensor) for tensor in tensors]

    def reduce_scatter(self, tensor: tf.Tensor) -> tf.Tensor:
        """Rank r's part of the element-wise sum over all ranks of 1-D `tensor` of P x c
        elements (fully known static shape, the same on every rank): elements
        [r c, (r + 1) c) of the sum - half the bytes of an all-reduce, which is this
        followed by an all-gather."""
        raise NotImplementedError(
            f"the {self.engine} engine offers no reduce-scatter on this device; all-reduce "
            "instead (`reduces_scatter` says which engines have it).")

    @abc.abstractmethod
    def all_gather(self, tensor: tf.Tensor) -> tf.Tensor:
        """Every rank's `tensor` concatenated along axis 0, in rank order (rows may differ)."""

    def all_gather_equal(self, tensor: tf.Tensor) -> tf.Tensor:
        """Every rank's `tensor` stacked in rank order: shape [P] + its shape.

        The tensor must have the same fully known static shape on every rank
        (what top-k indices and packed sign bits have): nothing is padded and
        no shapes are exchanged, one collective of P times its bytes.
        """
        tensor = checked_static_shape(tensor, "all_gather_equal")
        return self.all_gather(tensor[None])

    def all_gather_strings(self, text: str, max_bytes: int = 1024) -> List[str]:
        """Every rank's string `text` (UTF-8, at most `max_bytes`), in rank order (eager)."""
        data = text.encode()
        if len(data) > max_bytes:
            raise ValueError(f"string of {len(data)} bytes exceeds {max_bytes}. Got: {text!r}")
        codes = tf.constant([list(data) + [0] * (max_bytes - len(data))], tf.int32)
        return [bytes(int(c) for c in row if c).decode()
                for row in self.all_gather(codes).numpy()]

    @abc.abstractmethod
    def broadcast(self, tensor: tf.Tensor, root: int = 0) -> tf.Tensor:
        """Every rank gets `root`'s `tensor` (same shape and dtype on every rank)."""

    def broadcast_json(self, value: Any, root: int = 0) -> Any:
        """`root`'s JSON-able `value` on every rank (eager): its text's length, then its bytes -
        two broadcasts. None stays None."""
        import json  # pylint: disable=import-outside-toplevel
        import numpy as np  # pylint: disable=import-outside-toplevel

        data = json.dumps(value).encode() if value is not None else b""
        length = int(self.broadcast(tf.constant([len(data)], tf.int64), root).numpy()[0])
        if length == 0:
            return None
        codes = np.zeros([length], np.int32)
        if len(data) == length:
            codes[:] = np.frombuffer(data, np.uint8)
        received = self.broadcast(tf.constant(codes), root).numpy().astype(np.uint8)
        return json.loads(received.tobytes().decode())

    def barrier(self) -> None:
        """Return once every rank has called `barrier` (eager)."""
        self.all_reduce(tf.zeros([1])).numpy()

    # ------------------------------------------------------- point to point
    def reserve_instance_keys(self, count: int) -> int:
        """The first of `count` consecutive keys that pair a `send` with its `recv`.

        Every rank reserves the same blocks in the same order, also for
        transfers it does not take part in, so keys agree across ranks.
        """
        raise self._no_point_to_point()

    def send(self, tensor: tf.Tensor, peer: int, instance_key: int) -> tf.Operation:
        """Send `tensor` to rank `peer`, which calls `recv` with the same key."""
        raise self._no_point_to_point()

    def recv(self, shape: Sequence[int], dtype: tf.DType, peer: int,
             instance_key: int) -> tf.Tensor:
        """The tensor rank `peer` sends with `instance_key`."""
        raise self._no_point_to_point()

    def _no_point_to_point(self) -> NotImplementedError:
        return NotImplementedError(
            f"the {self.engine} engine offers no point-to-point transfers; use TensorFlow's "
            "collectives (engine 'collective')."
        )

    # ------------------------------------------------------------ profiling
    def start_engine_timeline(self, directory: str) -> None:
        """Start the engine's own timeline into `directory` if it keeps one (Horovod's)."""
        del directory

    def stop_engine_timeline(self) -> None:
        """Stop what `start_engine_timeline` started."""

    # ------------------------------------------------------------- liveness
    def expect_progress(self, description: str) -> ContextManager[None]:
        """Context manager bounding one call of a compiled function with collectives.

        Engines whose collectives time out by themselves need nothing here.
        """
        del description
        return contextlib.nullcontext()

    def gone_peers(self) -> List[int]:
        """Ranks whose process is gone now (to explain a failure); [] if unknown."""
        return []

    def stop_watching(self) -> None:
        """Stop watching the peers: from now on, a peer that exits is no failure."""

    def close(self) -> None:
        """Release what the communicator holds (at the end of the process)."""
        self.stop_watching()


def checked_scatter(tensor: tf.Tensor, world_size: int) -> Tuple[tf.Tensor, int]:
    """(`tensor`, c) for a reduce-scatter of 1-D `tensor` of world_size x c elements, or a
    ValueError saying what it takes."""
    tensor = checked_static_shape(tensor, "reduce_scatter")
    width = tensor.shape[0] // world_size
    if tensor.shape.rank != 1 or width * world_size != tensor.shape[0]:
        raise ValueError(f"reduce_scatter takes a 1-D tensor of a multiple of "
                         f"{world_size} elements. Got shape {tensor.shape}")
    return tensor, width


def checked_static_shape(tensor: tf.Tensor, collective: str) -> tf.Tensor:
    """`tensor` as a tensor, or a ValueError if its static shape is not fully known."""
    tensor = tf.convert_to_tensor(tensor)
    if not tensor.shape.is_fully_defined():
        raise ValueError(f"{collective} needs a tensor of fully known static shape, the same on "
                         f"every rank. Got shape {tensor.shape}")
    return tensor
