"""Gradient compression as an aggregation hook wrapping another: gradients compressed, state exact.

`CompressedAggregator(inner, compressor)` is an `Aggregator`. Of every
bucket it hands the `Compressor` only the tensors whose role is `GRADIENT`
(`base.Bucket.roles`); exact state (metric state, layer statistics, raw
logs, the profiling vector) and the row count `ROWS`, on which the share
weights depend, are summed exactly. The compressor moves its gradients
through a `Wire`: `wire.sum(tensors)` - a sum over ranks by the inner
algorithm - as many times as its algorithm needs (fp16: once; a low-rank
scheme: once per factor), and `wire.gather(tensor)` - every rank's tensor of
one static shape, stacked (`Communicator.all_gather_equal`: top-k's indices
and values), both timed and counted at the bytes actually sent. The first
sum also carries the bucket's exact tensors (they are summed on their own
when the compressor only gathers), so a step still makes one collective
call where the compressor makes one sum.

A compressor may keep state across steps (residuals for error feedback, a
warm-started factor): it creates it in `build`, as variables of the model's
optimizer (so it is broadcast from rank 0 when created, and saved and
restored with the optimizer's slots), and lists it in `variables`, which the
wrapper reports as `Aggregator.variables`. Such state is the rank's own (a
residual is this rank's compression error): the strategy never averages it
across ranks as it does other non-trainable variables.

`FP16Compression` casts floating-point gradients wider than 16 bits to
float16 before the exchange and back to their dtype after, halving the
gradient bytes every algorithm moves (cost model: the inner algorithm's
beta term for the gradient bytes x 1/2, plus two casts, memory traffic 3n/2
per tensor). Guarantee relative to the exact sum: each gradient is rounded
to float16 (relative error <= 2^-11) and summed in float16, so the result
differs from the float32 sum by about P * 2^-11 * max |g| and overflows past
65504. Gradients reach it weighted by their rank's share of the global
batch (`Aggregator.weights_gradients_first`), so the summed values are the
global gradient's, in range for ordinary losses. Non-float tensors pass
unchanged.

Which compressor runs where (`Compressor.check_supported`): a compressor
whose wire format is a sum (fp16, PowerSGD's factors) runs on the ring and
the tree; one that gathers every rank's message (top-k's indices and values,
1-bit's packed signs: their sum is not the sum of the gradients) needs the
ring's all-gather and is refused on the tree; the parameter server's servers
only sum what workers push, with no per-worker state, so of the lossy
schemes it runs fp16 only.
"""

import abc
import math
from typing import Any, List, Optional, Sequence

import tensorflow as tf

from tfdist.aggregation.base import GRADIENT, Aggregator, Bucket
from tfdist.profiling.names import algorithm_scope, communication_scope


class Compressor(abc.ABC):
    """How gradients are summed across ranks through fewer bytes; see the module docstring.

    Subclasses set `name` and implement `reduce`; a stateful one also
    `build` and `variables`, and one that cannot run on every algorithm
    `check_supported`.
    """

    name: str = "abstract"
    gathers: bool = False  # True: the wire format is every rank's message, gathered (not a sum)
    runs_on_servers: bool = False  # True: a parameter server's sum of it is still right
    # False only for a compressor as close to exact as the usual baseline (fp16): the cost
    # model picks one that changes the training only where it pays clearly (`recommend`).
    changes_training: bool = True
    keeps_rank_state: bool = False  # True: some state is this rank's own (`rank_variables`)

    @property
    def variables(self) -> List[tf.Variable]:
        """The compressor's state across steps (variables; none by default)."""
        return []

    @property
    def rank_variables(self) -> List[tf.Variable]:
        """The part of `variables` that differs per rank (residuals): kept per rank in
        checkpoints (`tfdist.strategies.state.rank_state`)."""
        return []

    def build(self, optimizer: Any, variables: Sequence[tf.Variable]) -> None:
        """Create state for the gradients of `variables` as `optimizer`'s variables
        (`Aggregator.build`: saved, restored and broadcast with them); none by default."""
        del optimizer, variables

    def runs_on(self, algorithm: str) -> bool:
        """Whether this compressor can run on the aggregation algorithm named `algorithm`
        ("ring", "tree", "ps"; module docstring: which compressor runs where)."""
        if algorithm == "ps":
            return self.runs_on_servers
        return algorithm == "ring" or not self.gathers

    def check_supported(self, aggregator: Aggregator) -> None:
        """Raise ValueError naming both if this compressor cannot run on `aggregator`
        (module docstring: which compressor runs where)."""
        if getattr(aggregator, "communicator", None) is None and not self.runs_on_servers:
            raise ValueError(
                f"tfdist: the {self.name!r} compressor cannot run on the {aggregator.name!r} "
                "algorithm: parameter servers only sum what the workers push and keep no "
                "per-worker state, so its messages cannot be decoded there (the parameter "
                "server supports compression='fp16'). Use RingAllReduceStrategy or "
                "ReductionTreeStrategy.")
        if self.gathers and aggregator.name != "ring":
            raise ValueError(
                f"tfdist: the {self.name!r} compressor gathers every rank's message (their sum "
                "is not the sum of the gradients); the "
                f"{aggregator.name!r} algorithm only sums along its edges and has no all-gather. "
                "Use RingAllReduceStrategy (TF collectives or Horovod), or a compressor whose "
                "messages add up: 'fp16' or PowerSGD.")

    @abc.abstractmethod
    def reduce(self, gradients: Sequence[tf.Tensor],
               variables: Sequence[Optional[tf.Variable]], wire: "Wire") -> List[tf.Tensor]:
        """The sums over ranks of `gradients` (same order, shapes and dtypes), every rank.

        Args:
            gradients: this rank's gradient tensors (static shapes), already
                weighted by its share of the global batch.
            variables: the variable of each gradient, or None where unknown.
            wire: the `Wire` to the other ranks (`sum`, `gather`; each
                callable several times).
        """

    def wire_ratio(self, dtype: tf.DType) -> float:
        """Bytes sent per gradient byte of `dtype` (the cost model's beta factor; 1: none)."""
        del dtype
        return 1.0

    def predict_seconds(self, shapes: Sequence[Sequence[int]], world_size: int, alpha: float,
                        beta: float, inner: Any, **options: Any) -> float:
        """Predicted seconds to sum float32 gradients of `shapes` over `world_size` ranks
        through the aggregation algorithm `inner` (its class or an instance, with its
        `options`), under the alpha-beta model. By default: the inner algorithm moving
        `wire_ratio(float32)` of the gradient bytes. The compressor's own arithmetic on the
        device (a top-k selection, a QR factorisation) is not modelled."""
        n_bytes = gradient_bytes(shapes) * self.wire_ratio(tf.float32)
        return inner.predict_seconds(n_bytes, world_size, alpha, beta, **options)


class ErrorFeedbackCompressor(Compressor):
    """A compressor that keeps, per gradient, this rank's residual: what it has not sent yet.

    Subclasses create residuals in `build` with `add_residual` and add them
    to what they send; `residual(variable)` reads one (tests, reports). They
    update their state with `assign_if_finite`: only in a step whose sums
    are finite, so that a step a `LossScaleOptimizer` skips for an overflow
    leaves the state as it was (the sums are the same on every rank, so is
    the decision).
    """

    keeps_rank_state = True

    def __init__(self):
        self._residuals = {}  # id(variable) -> this rank's residual for its gradient

    @property
    def variables(self):
        return list(self._residuals.values())

    @property
    def rank_variables(self):
        return list(self._residuals.values())

    @staticmethod
    def assign_if_finite(assignments, totals):
        """`totals`, after each (variable, new value) of `assignments` is assigned if every
        total is finite (else the variable keeps its value)."""
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in totals])
        updates = [variable.assign(tf.where(finite, tf.cast(value, variable.dtype), variable))
                   for variable, value in assignments]
        with tf.control_dependencies(updates):
            return [tf.identity(t) for t in totals]

    def add_residual(self, optimizer, variable):
        """Create `variable`'s residual (zeros) as one of `optimizer`'s variables."""
        self._residuals[id(variable)] = optimizer.add_variable_from_reference(
            variable, f"tfdist_{self.name}_residual")

    def residual(self, variable):
        """This rank's residual for `variable`'s gradient (a variable), or None: sent exactly."""
        return self._residuals.get(id(variable))

    def reduce(self, gradients, variables, wire):
        """Gradients with a residual through `compressed_sums`, the others summed exactly."""
        compressed, exact = split_by_state(gradients, variables, self._residuals)
        results = [None] * len(gradients)
        if exact:
            for position, total in zip(exact, wire.sum([gradients[p] for p in exact])):
                results[position] = total
        if compressed:
            totals = self.compressed_sums([gradients[p] for p in compressed],
                                          [variables[p] for p in compressed], wire)
            for position, total in zip(compressed, totals):
                results[position] = total
        return results

    def compressed_sums(self, gradients, variables, wire):
        """The sums over ranks of `gradients` (each with a residual), through `wire`."""
        raise NotImplementedError(f"{type(self).__name__} defines reduce itself")


def gradient_bytes(shapes):
    """Bytes of float32 gradients of `shapes`."""
    return 4 * sum(math.prod(shape) for shape in shapes)


def all_gather_seconds(bytes_per_rank, world_size, alpha, beta):
    """(P - 1) alpha + (P - 1) m beta: a ring all-gather of m bytes from each of P ranks
    (P - 1 steps, each passing one rank's message on); 0 for one rank."""
    steps = world_size - 1
    return steps * alpha + steps * bytes_per_rank * beta if steps > 0 else 0.0


def flatten(tensors):
    """`tensors` as one flat vector of their common dtype, and their sizes."""
    sizes = [t.shape.num_elements() for t in tensors]
    return tf.concat([tf.reshape(t, [-1]) for t in tensors], 0), sizes


def unflatten(flat, like):
    """The pieces of `flat` shaped and typed as `like` (the tensors `flatten` joined)."""
    pieces = tf.split(flat, [t.shape.num_elements() for t in like])
    return [tf.cast(tf.reshape(piece, t.shape), t.dtype) for piece, t in zip(pieces, like)]


def split_by_state(gradients, variables, state):
    """Positions of the gradients with compressor state (`state`: id(variable) -> anything)
    and a floating dtype, and the positions of the rest (summed exactly)."""
    stateful, exact = [], []
    for position, (gradient, variable) in enumerate(zip(gradients, variables)):
        known = variable is not None and id(variable) in state and gradient.dtype.is_floating
        (stateful if known else exact).append(position)
    return stateful, exact


class FP16Compression(Compressor):
    """Send floating-point gradients as float16 (half the bytes); see the module docstring."""

    name = "fp16"
    runs_on_servers = True
    changes_training = False

    def __repr__(self):
        return "FP16()"

    @staticmethod
    def _casts(tensor):
        return tensor.dtype.is_floating and tensor.dtype.size > 2

    def reduce(self, gradients, variables, wire):
        del variables
        summed = wire.sum([tf.cast(g, tf.float16) if self._casts(g) else g for g in gradients])
        return [tf.cast(s, g.dtype) if self._casts(g) else s for s, g in zip(summed, gradients)]

    def wire_ratio(self, dtype):
        return 2.0 / dtype.size if dtype.is_floating and dtype.size > 2 else 1.0


class CompressedAggregator(Aggregator):
    """`inner`, with the gradients of every bucket summed by `compressor` (module docstring).

    Buckets and names are the inner algorithm's, and so are the algorithm's
    own attributes (a parameter server's `server_stats`); the cost model is
    the compressor's (`Compressor.predict_seconds`, through the inner one).
    """

    weights_gradients_first = True  # a compressor sees the global gradient's values

    def __init__(self, inner, compressor):
        super().__init__()
        compressor.check_supported(inner)
        self.inner = inner
        self.compressor = compressor
        self.name = inner.name
        self.num_servers = inner.num_servers
        self.bucket_bytes = inner.bucket_bytes
        self.first_bucket_bytes = inner.first_bucket_bytes
        self._built = {}  # id(variable) -> the optimizer the compressor built its state with

    @property
    def compression_name(self):
        return self.compressor.name

    @property
    def variables(self):
        return list(self.compressor.variables)

    @property
    def rank_variables(self):
        return list(self.compressor.rank_variables)

    @property
    def counters(self):
        return self.inner.counters

    @counters.setter
    def counters(self, counters):
        # Only the inner algorithm's exchanges are timed: they carry the wire bytes.
        if hasattr(self, "inner"):
            self.inner.counters = counters

    def build(self, optimizer, variables):
        """The compressor's state for `variables` with `optimizer`: once per optimizer (a
        `LossScaleOptimizer` and the optimizer it wraps count as one; a new optimizer of a
        recompiled model gets new state)."""
        def same(built_with):
            return built_with is not None and (
                built_with is optimizer or getattr(optimizer, "inner_optimizer", None)
                is built_with or getattr(built_with, "inner_optimizer", None) is optimizer)

        new = [v for v in variables if not same(self._built.get(id(v)))]
        for variable in new:
            self._built[id(variable)] = optimizer
        if new:
            self.compressor.build(optimizer, new)

    def __getattr__(self, name):
        if name == "inner":  # not set yet (during __init__)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _reduce_named(self, bucket):
        gradients = [p for p, role in enumerate(bucket.roles) if role == GRADIENT]
        if not gradients:
            return self.inner._reduce_named(bucket)  # pylint: disable=protected-access
        wire = Wire(self, bucket)
        with tf.name_scope(algorithm_scope(self.compressor.name)):
            summed = self.compressor.reduce([bucket.tensors[p] for p in gradients],
                                            [bucket.variables[p] for p in gradients], wire)
        results = wire.exact_results()
        for position, total in zip(gradients, summed):
            results[position] = total
        return results

    def reduce_bucket(self, bucket):
        return self._reduce_named(bucket)

    def predict_seconds(self, n_bytes, world_size, alpha, beta, shapes=None,  # pylint: disable=W0221
                        **options):
        """The compressor's prediction (`Compressor.predict_seconds`) for float32 gradients
        of `shapes`, or, without them, of one square matrix of `n_bytes`."""
        if shapes is None:
            side = max(1, round(math.sqrt(n_bytes / 4)))
            shapes = [(side, side)]
        return self.compressor.predict_seconds(shapes, world_size, alpha, beta, self.inner,
                                               **options)

    def sent_bytes(self, n_bytes):
        return self.inner.sent_bytes(n_bytes)

    def close(self):
        self.inner.close()


class Wire:
    """What a compressor sends through, for one bucket (see the module docstring).

    `sum(tensors)`: element-wise sums over ranks by the inner algorithm; the
    first call carries the bucket's exact tensors along. `gather(tensor)`:
    every rank's `tensor` (one static shape on all ranks) stacked, [P, ...].
    """

    def __init__(self, aggregator, bucket):
        self._aggregator = aggregator
        self._bucket = bucket
        self._exact = [p for p, role in enumerate(bucket.roles) if role != GRADIENT]
        self._results = [None] * len(bucket.tensors)
        self._sums = 0

    def sum(self, tensors):
        """Element-wise sums over ranks of `tensors` (a list), through the inner algorithm."""
        bucket, first = self._bucket, self._sums == 0
        carried = self._exact if first else []
        if not carried and not tensors:
            return []
        self._sums += 1
        wire_bucket = Bucket(
            bucket.index if first else self._aggregator._bucket_numbers.take(),  # pylint: disable=protected-access
            tuple(bucket.tensors[p] for p in carried) + tuple(tensors),
            tuple(bucket.variables[p] for p in carried) + (None,) * len(tensors),
            tuple(bucket.roles[p] for p in carried) + (GRADIENT,) * len(tensors))
        summed = self._aggregator.inner._reduce_named(wire_bucket)  # pylint: disable=protected-access
        for position, total in zip(carried, summed):
            self._results[position] = total
        return summed[len(carried):]

    def gather(self, tensor):
        """Every rank's `tensor` stacked in rank order, [P, ...] (counted: P - 1 copies sent)."""
        communicator = self._aggregator.inner.communicator
        counters = self._aggregator.counters
        payload = tensor.shape.num_elements() * tensor.dtype.size
        with tf.name_scope(communication_scope(self._aggregator.compressor.name,
                                               f"gather_{self._bucket.index}")):
            if counters is None:
                return communicator.all_gather_equal(tensor)
            return counters.timed([tensor], lambda: communicator.all_gather_equal(tensor),
                                  payload, payload * (communicator.world_size - 1))

    def exact_results(self):
        """The sums of the bucket's exact tensors (summed now if no `sum` carried them)."""
        if self._exact and self._sums == 0:
            self.sum([])
        return list(self._results)
