"""`recommend`: the cost model's choice of aggregation algorithm for a model and a network."""

import dataclasses
import math
import numbers

from tfdist.aggregation.cost_model import predict_all_reduce_seconds
from tfdist.aggregation.parameter_server import DEFAULT_PIECE_BYTES
from tfdist.aggregation.tree import DEFAULT_CHUNK_BYTES

# Settings searched (each algorithm's defaults first: on a tie the default wins).
SMALLEST_CHUNK_BYTES = 64 * 1024
PIECE_BYTES_CHOICES = (DEFAULT_PIECE_BYTES, 2 * DEFAULT_PIECE_BYTES, 3 * DEFAULT_PIECE_BYTES)
STRATEGIES = {"ring": "RingAllReduceStrategy", "tree": "ReductionTreeStrategy",
              "ps": "ParameterServerStrategy"}


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One algorithm with its settings and the cost model's time for one aggregation.

    Attributes:
        algorithm: "ring", "tree" or "ps" (`tfdist.aggregation.cost_model.ALGORITHMS`).
        options: the settings the model depends on, named as the strategy's
            arguments: {} (ring), {"fanout", "chunk_bytes"} (tree),
            {"num_servers", "piece_bytes"} (ps).
        predicted_seconds: the algorithm's `predict_seconds` for these settings.
    """

    algorithm: str
    options: dict
    predicted_seconds: float


@dataclasses.dataclass(frozen=True)
class Recommendation(Candidate):
    """The fastest `Candidate`, with every candidate ranked (`alternatives`, fastest first).

    Attributes:
        alternatives: every candidate considered, fastest first (the pick is the first).
        n_bytes, processes, bandwidth, latency: what the choice was made for.
    """

    alternatives: tuple = ()
    n_bytes: int = 0
    processes: int = 0
    bandwidth: float = 0.0
    latency: float = 0.0

    def strategy(self, **kwargs):
        """Build the recommended strategy: `RingAllReduceStrategy()`,
        `ReductionTreeStrategy(fanout=..., chunk_bytes=...)` or
        `ParameterServerStrategy(num_servers=..., piece_bytes=...)`.

        `kwargs` go to the constructor too (e.g. `compression="fp16"`). A
        parameter server with K servers needs a cluster that has them:
        `tfdist-run -np P --num-servers K` (or `ps` tasks in TF_CONFIG), or,
        for K = P, no dedicated servers (one co-located with each worker).
        The class is looked up by name when called, so that this layer does
        not import the strategies built on top of it.
        """
        import tfdist  # pylint: disable=import-outside-toplevel

        return getattr(tfdist.strategies, STRATEGIES[self.algorithm])(**self.options, **kwargs)


def recommend(model_or_bytes, processes, bandwidth, latency, candidates=None):
    """The fastest gradient-aggregation algorithm and settings under the alpha-beta cost model.

    Every candidate - the ring; the reduction tree with each fanout 2 .. P - 1
    and pipeline chunks of 64 KiB, 128 KiB, ... up to the whole buffer; the
    parameter server with 1 .. P servers and pieces of 1, 2 or 3 MiB - is
    timed with its aggregator's `predict_seconds(n, P, alpha, beta, **options)`
    (the formulas derived in `RingAllReduceAggregator`,
    `ReductionTreeAggregator` and `ParameterServerAggregator`), with
    alpha = `latency` and beta = 8 / `bandwidth` seconds per byte, and the
    candidates are ranked by that time. The model counts messages and bytes
    on the busiest link only: it knows nothing of the hosts' own per-byte and
    per-message costs (copies, serialization, summation), so on a fast
    network, where those dominate, its ranking is only as good as the
    network's share of the time.

    Args:
        model_or_bytes: a Keras model (n = the bytes of its trainable
            variables, i.e. of one gradient) or the gradient's size in bytes.
        processes: number of training processes P (>= 2).
        bandwidth: each process's link bandwidth in **bits per second**, as
            network specifications give it (10 Gbit/s Ethernet: 10e9).
        latency: one message's latency in **seconds** (half a round trip).
        candidates: optional iterable of (algorithm, options) pairs to choose
            from instead of the full search (e.g. only what a cluster offers).

    Returns:
        A `Recommendation`; `recommendation.strategy()` builds its strategy.

    Example:

    >>> pick = recommend(100e6, processes=8, bandwidth=10e9, latency=50e-6)
    >>> pick.algorithm, round(pick.predicted_seconds, 4)
    ('ring', 0.1407)
    """
    n_bytes = gradient_bytes(model_or_bytes)
    _check_number("processes", processes, integer=True, minimum=2)
    _check_number("bandwidth", bandwidth, minimum=0, strict=True)
    _check_number("latency", latency, minimum=0)
    alpha, beta = float(latency), 8.0 / bandwidth
    pairs = search_space(n_bytes, processes) if candidates is None else list(candidates)
    if not pairs:
        raise ValueError("candidates must list at least one (algorithm, options) pair.")
    ranked = sorted((Candidate(algorithm, dict(options), predict_all_reduce_seconds(
        algorithm, n_bytes, processes, alpha, beta, **options)) for algorithm, options in pairs),
        key=lambda c: c.predicted_seconds)
    best = ranked[0]
    return Recommendation(best.algorithm, best.options, best.predicted_seconds, tuple(ranked),
                          n_bytes, processes, float(bandwidth), float(latency))


def search_space(n_bytes, processes):
    """Every (algorithm, options) pair `recommend` considers for n bytes over P processes."""
    pairs = [("ring", {})]
    chunks = [SMALLEST_CHUNK_BYTES]
    while chunks[-1] < n_bytes:
        chunks.append(chunks[-1] * 2)
    if DEFAULT_CHUNK_BYTES in chunks:  # the default first: it wins ties
        chunks.remove(DEFAULT_CHUNK_BYTES)
        chunks.insert(0, DEFAULT_CHUNK_BYTES)
    pairs += [("tree", {"fanout": fanout, "chunk_bytes": chunk})
              for fanout in range(2, max(3, processes)) for chunk in chunks]
    pairs += [("ps", {"num_servers": servers, "piece_bytes": piece})
              for servers in range(1, processes + 1) for piece in PIECE_BYTES_CHOICES]
    return pairs


def gradient_bytes(model_or_bytes):
    """n: a byte count as given, or the bytes of a Keras model's trainable variables."""
    variables = getattr(model_or_bytes, "trainable_variables", None)
    if variables is not None:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        n_bytes = sum(math.prod(v.shape) * tf.as_dtype(v.dtype).size for v in variables)
        if n_bytes == 0:
            raise ValueError("the model has no trainable variables (is it built?): nothing to "
                             f"aggregate. Got: {model_or_bytes!r}")
        return int(n_bytes)
    _check_number("model_or_bytes", model_or_bytes, minimum=0, strict=True,
                  what="a Keras model or a positive number of bytes")
    return int(math.ceil(model_or_bytes))


def _check_number(name, value, minimum, integer=False, strict=False, what=None):
    kind = numbers.Integral if integer else numbers.Real
    ok = isinstance(value, kind) and not isinstance(value, bool) and math.isfinite(value) and (
        value > minimum if strict else value >= minimum)
    if not ok:
        bound = f"> {minimum}" if strict else f">= {minimum}"
        what = what or f"{'an integer' if integer else 'a number'} {bound}"
        raise ValueError(f"{name} must be {what}. Got: {value!r}")

