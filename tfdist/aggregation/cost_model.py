"""Alpha-beta cost model: predicted time of one all-reduce per algorithm.

alpha is the latency of one message (seconds), beta the time per byte
(seconds / byte, the inverse of a link's bandwidth), n the bytes each
process contributes, P the number of processes. Each algorithm derives its
formula in its docstring and computes it in its own `predict_seconds`; this
module only looks the algorithm up by name, for the benchmarks (fitting
alpha and beta, predicting crossovers) and for users choosing an algorithm.
"""

from tfdist.aggregation.parameter_server import ParameterServerAggregator
from tfdist.aggregation.ring import RingAllReduceAggregator
from tfdist.aggregation.tree import ReductionTreeAggregator

ALGORITHMS = {
    "ring": RingAllReduceAggregator,
    "tree": ReductionTreeAggregator,
    "ps": ParameterServerAggregator,
}


def predict_all_reduce_seconds(algorithm, n_bytes, world_size, alpha, beta, **options):
    """Predicted seconds for one all-reduce of `n_bytes` over `world_size` processes.

    Args:
        algorithm: "ring", "tree" or "ps".
        n_bytes: bytes each process contributes (the gradient size).
        world_size: number of processes P.
        alpha: latency per message in seconds.
        beta: seconds per byte on a link.
        **options: the algorithm's settings: `fanout`, `chunk_bytes` (tree);
            `num_servers`, `piece_bytes` (ps).

    Example:

    >>> predict_all_reduce_seconds("ring", 4 << 20, 4, alpha=1e-4, beta=1e-9)
    0.00689...
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {tuple(ALGORITHMS)}. Got: {algorithm!r}")
    return ALGORITHMS[algorithm].predict_seconds(n_bytes, world_size, alpha, beta, **options)
