"""The one interface every gradient-aggregation algorithm implements: a communication hook.

In the spirit of PyTorch DDP's communication hooks: the strategy hands an
algorithm a `Bucket` - the tensors to sum across the training processes,
the variable each belongs to, and the bucket's index - and the algorithm
returns, on every rank, the element-wise sums over ranks in the same order
and shapes (`Aggregator.reduce_bucket`). An algorithm is an object, so it
may keep state across steps (a residual per variable for error feedback, a
server protocol's clocks, counters for a profiler), keyed by the bucket's
index or its variables. Each algorithm also owns its alpha-beta cost model
(`predict_seconds`), next to the docstring that derives it: one formula per
algorithm, used by `tfdist.aggregation.cost_model` and the benchmarks, and
the bytes each rank sends (`sent_bytes`).

An algorithm that sets `bucket_bytes` gets one `all_reduce` call cut into
reverse-order buckets (`Aggregator.bucket_positions`): separate collectives,
last tensor first, so a compiled step sums its last layers' gradients while
the backward pass still computes the first layers'.

Every bucket is reduced under the name scope `tfdist/<algorithm>/<kind>_<index>`
(so its ops show by that name in the profiler's trace viewer and in the
merged timeline, `tfdist.profiling.timeline`; the names are built in
`tfdist.profiling.names`) and, while a training step is traced with
communication counters enabled, timed by them (`tfdist.profiling.counters`).

Docstrings of implementations state the algorithm, the cost model (alpha:
per-message latency in seconds, beta: seconds per byte, n: bytes each
process contributes, P: processes) and what result they guarantee relative
to an exact sum.
"""

import abc
import dataclasses
from typing import Any, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from tfdist.aggregation.fusion import reverse_order_buckets
from tfdist.comm.trace_counter import TraceStableCounter
from tfdist.profiling.names import bucket_scope

# What a tensor of a bucket is (`Bucket.roles`): a hook that changes values (lossy
# compression) may only ever change a GRADIENT; everything else must be summed exactly.
GRADIENT = "gradient"  # a gradient, weighted by its rank's share of the global batch
EXACT = "exact"  # metric state, layer statistics, raw logs, counters, stop flags
ROWS = "rows"  # a rank's row count, from which every share weight is computed
ROLES = (GRADIENT, EXACT, ROWS)

# A bucket's kind, in its name scope: GRADIENTS if it holds a gradient.
GRADIENTS = "gradients"
STATE = "state"


@dataclasses.dataclass(frozen=True)
class Bucket:
    """Tensors summed across ranks in one call of an aggregation hook.

    Attributes:
        index: this bucket's number in the process, in the order the call
            sites were traced (the same on every rank, also for a step traced
            again: `trace_counter`; a traced step reuses its buckets at every
            call).
        tensors: the tensors to sum, each of static shape.
        variables: for each tensor, the variable it is the gradient of, or
            None (state that is not a gradient).
        roles: for each tensor, what it is: `GRADIENT`, `EXACT` or `ROWS`.
    """

    index: int
    tensors: Tuple[tf.Tensor, ...]
    variables: Tuple[Optional[tf.Variable], ...]
    roles: Tuple[str, ...]

    @property
    def kind(self) -> str:
        """`GRADIENTS` if the bucket holds a gradient, else `STATE` (its name scope says so)."""
        return GRADIENTS if GRADIENT in self.roles else STATE

    @property
    def num_bytes(self) -> int:
        return sum(static_bytes(t) for t in self.tensors)


def static_bytes(tensor: tf.Tensor) -> int:
    """Bytes of `tensor` from its static shape (0 while its shape is not fully known)."""
    elements = tensor.shape.num_elements()
    return 0 if elements is None else elements * tensor.dtype.size


def with_static_shape(tensor: tf.Tensor, variable: Optional[tf.Variable] = None) -> tf.Tensor:
    """`tensor` with a fully known static shape where one is known.

    Inside a traced step a gradient's static shape can be less known than its
    variable's: a `Dense` kernel applied to a 3-D tensor gets a gradient of
    static shape (None, units). A gradient has its variable's shape, so it is
    given that shape (a reshape: no copy, no runtime cost).
    """
    if tensor.shape.is_fully_defined() or variable is None:
        return tensor
    shape = tf.TensorShape(variable.shape)
    if not shape.is_fully_defined():
        return tensor
    return tf.reshape(tensor, shape)


def require_static_shapes(bucket: Bucket, algorithm: str) -> None:
    """A clear error if a tensor of `bucket` has no fully known static shape (`algorithm`
    cuts buffers into pieces of static sizes)."""
    for position, tensor in enumerate(bucket.tensors):
        if not tensor.shape.is_fully_defined():
            raise ValueError(
                f"tfdist {algorithm}: the sum of a tensor of shape {tensor.shape} "
                f"({tensor.name if hasattr(tensor, 'name') else 'tensor'} at position {position}"
                f" of {bucket.kind} bucket {bucket.index}) needs a static shape; give it one "
                "(tf.ensure_shape) or use RingAllReduceStrategy, which sums tensors of any shape.")


def positive_bytes(name: str, value: Any) -> int:
    """`value` as a positive int, or a ValueError naming the setting."""
    if int(value) < 1:
        raise ValueError(f"{name} must be a positive number of bytes. Got: {value!r}")
    return int(value)


class Aggregator(abc.ABC):
    """A gradient-aggregation algorithm (communication hook); see the module docstring.

    Subclasses set `name`, implement `reduce_bucket` and `predict_seconds`.
    `communicates` is False only for the single-process identity: then
    nothing goes on a wire, and gradient compression does not apply.
    `weights_gradients_first` is True for a hook that must see each rank's
    gradient weighted by its share of the global batch (a compressor); by
    default the share weights are applied after the sum (`step_sum`).
    `learns_rows_first` is True where a small all-reduce through the hook costs
    less than a pass over the gradients (the ring on Open MPI's engine): each
    step then learns the global row count before its backward pass, weights the
    loss by the share and leaves the gradients as they come (`row_accounting`).
    `variables` is the hook's state across steps, created by `build` as
    variables of the model's optimizer, so that it is broadcast from rank 0
    when created and saved and restored with the optimizer's own (a
    `ModelCheckpoint`, `BackupAndRestore`, `model.save`).
    """

    name: str = "abstract"
    communicates: bool = True
    num_servers: int = 0  # parameter servers the algorithm sends to (counted per server)
    # Reverse-order buckets (`bucket_positions`): largest bucket and first bucket, in
    # bytes; None: one bucket per call.
    bucket_bytes: Optional[int] = None
    first_bucket_bytes: Optional[int] = None
    weights_gradients_first: bool = False
    learns_rows_first: bool = False

    def __init__(self) -> None:
        self._bucket_numbers = TraceStableCounter(span=64)
        # The process's `CommunicationCounters`, set by the strategy (None: not counted).
        self.counters: Any = None

    @property
    def variables(self) -> List[tf.Variable]:
        """The algorithm's state across steps (variables; none by default)."""
        return []

    @property
    def rank_variables(self) -> List[tf.Variable]:
        """The part of `variables` that is this rank's own (a compressor's residuals)."""
        return []

    def build(self, optimizer: Any, variables: Sequence[tf.Variable]) -> None:
        """Create the state the hook keeps for the gradients of `variables` (none by default).

        Called when Keras builds `optimizer` for `variables` (before the
        first step, and before a checkpoint is restored into it). State is
        created with `optimizer.add_variable_from_reference(variable, name)`
        (or `add_variable`): it is then one of the optimizer's variables,
        created under the strategy's scope (rank 0's initial value on every
        rank) and saved and restored with the optimizer's slots. A variable
        built before (an optimizer wrapping another) is skipped.
        """
        del optimizer, variables

    def all_reduce(self, tensors: Sequence[tf.Tensor],
                   variables: Optional[Sequence[Optional[tf.Variable]]] = None,
                   roles: Union[str, Sequence[str]] = EXACT) -> List[tf.Tensor]:
        """Sum `tensors` across ranks: one new bucket per group of `bucket_positions`.

        Args:
            tensors: list of tensors (a gradient of a less known static shape
                than its variable's gets the variable's, `with_static_shape`).
            variables: the variable of each tensor (None: not gradients).
            roles: the role of each tensor (`ROLES`), or one role for all.
        """
        if not tensors:
            return []
        variables = tuple(variables) if variables is not None else (None,) * len(tensors)
        roles = (roles,) * len(tensors) if isinstance(roles, str) else tuple(roles)
        unknown = set(roles) - set(ROLES)
        if unknown or len(roles) != len(tensors):
            raise ValueError(f"roles must give one of {ROLES} per tensor. Got: {roles!r}")
        tensors = [with_static_shape(t, v) for t, v in zip(tensors, variables)]
        results: List[Any] = [None] * len(tensors)
        for positions in self.bucket_positions(tensors):
            index = self._bucket_numbers.take()
            bucket = Bucket(index, tuple(tensors[p] for p in positions),
                            tuple(variables[p] for p in positions),
                            tuple(roles[p] for p in positions))
            for position, total in zip(positions, self._reduce_named(bucket)):
                results[position] = total
        return results

    def _reduce_named(self, bucket: Bucket) -> List[tf.Tensor]:
        with tf.name_scope(self.scope_name(bucket)):
            if self.counters is None:
                return list(self.reduce_bucket(bucket))
            return list(self.counters.timed(bucket.tensors, lambda: self.reduce_bucket(bucket),
                                            bucket.num_bytes, self.sent_bytes(bucket.num_bytes)))

    def bucket_positions(self, tensors: Sequence[tf.Tensor]) -> List[List[int]]:
        """Which of `tensors` are reduced together, bucket by bucket, in issue order.

        With `bucket_bytes` set: reverse-order buckets
        (`fusion.reverse_order_buckets`), so that the gradients of the last
        layers, which the backward pass produces first, are summed while the
        earlier layers' gradients are still computing; each bucket is its
        own collective, issued as soon as its tensors exist. Without: all
        tensors in one bucket.
        """
        if self.bucket_bytes is None:
            return [list(range(len(tensors)))]
        return reverse_order_buckets(
            [static_bytes(t) for t in tensors],
            self.bucket_bytes, self.first_bucket_bytes)

    def scope_name(self, bucket: Bucket) -> str:
        """The absolute name scope of `bucket`'s ops: `tfdist/<algorithm>/<kind>_<index>/`."""
        return bucket_scope(self.name, bucket.kind, bucket.index)

    @abc.abstractmethod
    def reduce_bucket(self, bucket: Bucket) -> Sequence[tf.Tensor]:
        """The element-wise sums over ranks of `bucket.tensors`, in order (every rank)."""

    @classmethod
    @abc.abstractmethod
    def predict_seconds(cls, n_bytes: float, world_size: int, alpha: float, beta: float,
                        **options: Any) -> float:
        """Predicted seconds to aggregate `n_bytes` per process over `world_size` processes.

        `options` are the algorithm's own constructor settings (fanout,
        servers, chunk size, ...); see each implementation.
        """

    def sent_bytes(self, n_bytes: int) -> int:
        """Bytes this rank puts on the wire to aggregate a bucket of `n_bytes` (0 by default)."""
        del n_bytes
        return 0

    def close(self) -> None:
        """Release what the algorithm holds (servers, threads); nothing by default."""

    def __enter__(self) -> "Aggregator":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
