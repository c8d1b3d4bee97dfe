"""`recommend`: the cost model's choice of aggregation algorithm for a model and a network."""

import dataclasses
import math
import numbers

from tfdist.aggregation.cost_model import ALGORITHMS, predict_all_reduce_seconds
from tfdist.aggregation.parameter_server import DEFAULT_PIECE_BYTES
from tfdist.aggregation.tree import DEFAULT_CHUNK_BYTES
from tfdist.comm import engines


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
        predicted_seconds: the algorithm's `predict_seconds` for these settings
            (the compressor's, `Compressor.predict_seconds`, with one).
        compression: None, or the `tfdist.compression` object the gradients
            are sent through.
        memory_bytes: what one training process holds of the model's training
            state (`training_memory_bytes`): parameters, gradients and its part of the
            optimizer state.
    """

    algorithm: str
    options: dict
    predicted_seconds: float
    compression: object = None
    memory_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class Recommendation(Candidate):
    """The fastest `Candidate`, with every candidate ranked (`alternatives`, fastest first).

    Attributes:
        alternatives: every candidate considered, fastest first (with lossy
            compressors, the pick may not be the first: see `recommend`).
        n_bytes, processes, bandwidth, latency, compute_seconds: what the
            choice was made for.
    """

    alternatives: tuple = ()
    n_bytes: int = 0
    processes: int = 0
    bandwidth: float = 0.0
    latency: float = 0.0
    compute_seconds: float = 0.0
    _baseline_step: float = 0.0

    def strategy(self, **kwargs):
        """Build the recommended strategy: `RingAllReduceStrategy()`,
        `ReductionTreeStrategy(fanout=..., chunk_bytes=...)` or
        `ParameterServerStrategy(num_servers=..., piece_bytes=...)`.

        `kwargs` go to the constructor too (e.g. `compression="fp16"`; the
        recommended compression, if any, unless `compression` is given). A
        parameter server with K servers needs a cluster that has them:
        `tfdist-run -np P --num-servers K` (or `ps` tasks in TF_CONFIG), or,
        for K = P, no dedicated servers (one co-located with each worker).
        The class is looked up by name when called, so that this layer does
        not import the strategies built on top of it.
        """
        import tfdist  # pylint: disable=import-outside-toplevel

        if self.compression is not None:
            kwargs.setdefault("compression", self.compression)
        return getattr(tfdist.strategies, STRATEGIES[self.algorithm])(**self.options, **kwargs)

    @property
    def step_speedup(self):
        """How many times faster a step is predicted to be than with the best uncompressed
        (or fp16) candidate: (compute + its time) / (compute + this time)."""
        return self._baseline_step / (self.compute_seconds + self.predicted_seconds)


# A lossy compressor (it changes the training: more steps to the same accuracy, or a lower
# one) is picked only when it makes the whole step this many times faster than the best
# lossless choice (fp16 counts as lossless: Agarwal et al., MLSys 2022, advise comparing
# against it). Calibrated on experiments/results/compression_training.json.
LOSSY_STEP_SPEEDUP = 2.0


def default_compressors():
    """The compressors `recommend(..., compression=True)` considers: fp16 and PowerSGD rank 4,
    the two that stayed within 0.5 points of uncompressed accuracy on both models of the
    experiment (experiments/results/compression_training.json); PowerSGD rank 1 and 2, top-k
    and 1-bit lost more on at least one, and are considered only when passed explicitly."""
    from tfdist import compression  # pylint: disable=import-outside-toplevel

    return (compression.FP16(), compression.PowerSGD(rank=4))


def training_memory_bytes(algorithm, options, n_bytes, processes, optimizer_state_bytes):
    """Bytes of training state one worker process holds: its parameters and gradient (2 n)
    and the optimizer state s - s / P and a 1-D copy of its n / P parameters with the ring's
    `shard_optimizer_state`; none with parameter servers, which keep the parameters' master
    copy and the state (n + s) / K on each of their K servers, co-located with the workers
    when K = P."""
    s = optimizer_state_bytes
    if algorithm == "ring" and options.get("shard_optimizer_state"):
        return int(2 * n_bytes + (s + n_bytes) / processes)
    if algorithm == "ps":
        servers = options.get("num_servers", processes)
        return int(2 * n_bytes + ((n_bytes + s) / servers if servers == processes else 0))
    return int(2 * n_bytes + s)


def recommend(model_or_bytes, processes, bandwidth, latency, candidates=None, compression=False,
              compute_seconds=0.0, optimizer_state_bytes=0, memory_budget_bytes=None,
              backend="collective"):
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
        compression: False (uncompressed only), True (also every compressor
            of `default_compressors()`), or compressors (names or
            `tfdist.compression` objects, one or an iterable). Each is timed on the algorithms it runs on
            (`Compressor.runs_on`) with its own `predict_seconds` for the
            model's gradient shapes (a byte count: one square matrix; an
            `Embedding`'s sparse gradient counted as sent exactly). fp16
            is picked whenever it is fastest; a lossy compressor (PowerSGD,
            top-k, 1-bit) only if the whole step, `compute_seconds` plus
            communication, is at least `LOSSY_STEP_SPEEDUP` (2x) faster than
            with the best uncompressed or fp16 candidate
            (`Compressor.changes_training`): it changes the training, so a
            small gain does not pay (the experiment in
            experiments/results/compression_training.json; the README).
        compute_seconds: the step's computation on one process, seconds
            (communication assumed not overlapped with it); 0: communication only.
        optimizer_state_bytes: the optimizer's state s in bytes (Adam: 2 n, SGD with
            momentum: n; 0: not counted). With s > 0 the ring with
            `shard_optimizer_state=True` is a candidate too: its time adds the
            parameters' all-gather (none on `backend` "horovod"), its memory holds
            s / P (`training_memory_bytes`, each candidate's `memory_bytes`).
        memory_budget_bytes: what one process may hold of training state, in bytes
            (None: no limit): the candidates over it are left out; a ValueError
            if none fits. The sharded ring is never faster (on Horovod it ties, and the
            unsharded one, listed first, wins), so it is picked when the memory asks
            for it.
        backend: the ring's engine, "collective" (TensorFlow's), "horovod" or "mpi"
            (Open MPI's): the last two reduce-scatter the sharded ring's gradients,
            which then costs what the unsharded ring does
            (`RingAllReduceAggregator.predict_seconds`); the sharded candidate's
            options carry it.

    Returns:
        A `Recommendation`; `recommendation.strategy()` builds its strategy
        (with its compression, if any).

    Example:

    >>> pick = recommend(100e6, processes=8, bandwidth=10e9, latency=50e-6)
    >>> pick.algorithm, round(pick.predicted_seconds, 4)
    ('ring', 0.1407)
    """
    n_bytes = gradient_bytes(model_or_bytes)
    _check_number("processes", processes, integer=True, minimum=2)
    _check_number("bandwidth", bandwidth, minimum=0, strict=True)
    _check_number("latency", latency, minimum=0)
    _check_number("compute_seconds", compute_seconds, minimum=0)
    _check_number("optimizer_state_bytes", optimizer_state_bytes, minimum=0)
    if memory_budget_bytes is not None:
        _check_number("memory_budget_bytes", memory_budget_bytes, minimum=0, strict=True)
    if backend not in engines.ENGINES:  # `RingAllReduceStrategy(backend=...)`'s engines
        raise ValueError(f"backend must be one of {tuple(engines.ENGINES)}. Got: {backend!r}")
    alpha, beta = float(latency), 8.0 / bandwidth
    pairs = (search_space(n_bytes, processes, optimizer_state_bytes, backend)
             if candidates is None else list(candidates))
    if not pairs:
        raise ValueError("candidates must list at least one (algorithm, options) pair.")
    compressors = _compressors(compression)
    shapes, exact_shapes = gradient_shapes(model_or_bytes, n_bytes)

    def memory(algorithm, options):
        return training_memory_bytes(algorithm, options, n_bytes, processes,
                                     optimizer_state_bytes)

    ranked = [Candidate(algorithm, dict(options), predict_all_reduce_seconds(
        algorithm, n_bytes, processes, alpha, beta, **options), None, memory(algorithm, options))
              for algorithm, options in pairs]

    def compressed_seconds(compressor, algorithm, options):
        inner = ALGORITHMS[algorithm]
        seconds = compressor.predict_seconds(shapes, processes, alpha, beta, inner, **options)
        if exact_shapes:  # sparse gradients travel exactly, whatever the compressor
            seconds += inner.predict_seconds(4 * sum(math.prod(s) for s in exact_shapes),
                                             processes, alpha, beta, **options)
        return seconds

    for compressor in compressors:
        ranked += [Candidate(algorithm, dict(options),
                             compressed_seconds(compressor, algorithm, options), compressor,
                             memory(algorithm, options))
                   for algorithm, options in pairs if compressor.runs_on(algorithm)
                   and not options.get("shard_optimizer_state")]  # sharding: uncompressed
    ranked.sort(key=lambda c: c.predicted_seconds)
    if memory_budget_bytes is not None:
        fitting = [c for c in ranked if c.memory_bytes <= memory_budget_bytes]
        if not fitting:
            least = min(ranked, key=lambda c: c.memory_bytes)
            raise ValueError(
                f"no candidate fits memory_budget_bytes={memory_budget_bytes}: the least is "
                f"{least.algorithm} {least.options} with {least.memory_bytes} bytes per process "
                f"({n_bytes} bytes of parameters, {optimizer_state_bytes} of optimizer state, "
                f"{processes} processes)")
        ranked = fitting
    lossless = [c for c in ranked if not _lossy(c.compression)]
    best = lossless[0]
    baseline = float(compute_seconds) + best.predicted_seconds
    lossy = [c for c in ranked if _lossy(c.compression)]
    if lossy and baseline >= LOSSY_STEP_SPEEDUP * (compute_seconds + lossy[0].predicted_seconds):
        best = lossy[0]
    return Recommendation(best.algorithm, best.options, best.predicted_seconds, best.compression,
                          best.memory_bytes, tuple(ranked), n_bytes, processes,
                          float(bandwidth), float(latency), float(compute_seconds), baseline)


def _compressors(compression):
    if compression is False or compression is None:
        return ()
    if compression is True:
        return default_compressors()
    from tfdist.aggregation.compressors import get_compressor  # pylint: disable=C0415

    if isinstance(compression, str) or not hasattr(compression, "__iter__"):
        compression = (compression,)  # one name or one compressor
    return tuple(get_compressor(c) for c in compression if get_compressor(c) is not None)


def _lossy(compressor):
    return compressor is not None and compressor.changes_training


def gradient_shapes(model_or_bytes, n_bytes):
    """The shapes of the gradients a compressor gets, and of those that travel exactly: a
    Keras model's trainable variables (an `Embedding`'s table, whose gradient is sparse
    rows that are gathered exactly, among the second), or for a byte count one square
    float32 matrix of about that many bytes."""
    variables = getattr(model_or_bytes, "trainable_variables", None)
    if variables is None:
        side = max(1, round(math.sqrt(n_bytes / 4)))
        return [(side, side)], []
    compressed, exact = [], []
    for variable in variables:
        sparse = getattr(variable, "name", "") == "embeddings"  # keras.layers.Embedding's
        (exact if sparse else compressed).append(tuple(variable.shape))
    return compressed, exact


def search_space(n_bytes, processes, optimizer_state_bytes=0, backend="collective"):
    """Every (algorithm, options) pair `recommend` considers for n bytes over P processes
    (the ring with its optimizer state sharded too when there is state to shard, on
    `backend` when it reduce-scatters: Horovod's or Open MPI's)."""
    pairs = [("ring", {})]
    if optimizer_state_bytes:
        pairs.append(("ring", {"shard_optimizer_state": True,
                               **({"backend": backend}
                                  if engines.engine(backend).reduces_scatter else {})}))
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

