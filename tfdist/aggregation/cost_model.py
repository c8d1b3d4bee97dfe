"""Alpha-beta cost model: predicted time of one all-reduce per algorithm.

alpha is the latency of one message (seconds), beta the time per byte
(seconds / byte, the inverse of a link's bandwidth), n the bytes each
process contributes, P the number of processes. Each algorithm's docstring
derives its formula; this module is the one place they are computed, for
the benchmarks (fitting alpha and beta, predicting crossovers) and for users
choosing an algorithm.
"""

import math

from tfdist.aggregation.parameter_server import DEFAULT_PIECE_BYTES
from tfdist.aggregation.tree import DEFAULT_CHUNK_BYTES, KaryTree

ALGORITHMS = ("ring", "tree", "ps")


def ring_seconds(n_bytes, world_size, alpha, beta):
    """2 (P - 1) alpha + 2 (P - 1) / P n beta (reduce-scatter + all-gather)."""
    p = world_size
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes * beta


def tree_seconds(n_bytes, world_size, alpha, beta, fanout=2, chunk_bytes=DEFAULT_CHUNK_BYTES):
    """2 (d + C - 1) (alpha + k n / C beta): reduce and broadcast, each a pipeline."""
    depth = KaryTree(world_size, fanout).depth
    if depth == 0:
        return 0.0
    fanout = min(fanout, world_size - 1)
    chunks = max(1, math.ceil(n_bytes / chunk_bytes))
    return 2 * (depth + chunks - 1) * (alpha + fanout * n_bytes / chunks * beta)


def parameter_server_seconds(n_bytes, world_size, alpha, beta, num_servers=1,
                             piece_bytes=DEFAULT_PIECE_BYTES):
    """2 (m alpha + P n / K beta), m = ceil(n / (K b)) pieces per server: each of K servers
    takes n / K from all P workers and returns the sum to each (push, then pull; the
    busiest server's link is the limit), in m chained calls of at most b bytes."""
    if world_size == 1:
        return 0.0
    pieces = max(1, math.ceil(n_bytes / (num_servers * piece_bytes)))
    return 2 * (pieces * alpha + world_size * n_bytes / num_servers * beta)


def predict_all_reduce_seconds(algorithm, n_bytes, world_size, alpha, beta, fanout=2,
                               chunk_bytes=DEFAULT_CHUNK_BYTES, num_servers=1,
                               piece_bytes=DEFAULT_PIECE_BYTES):
    """Predicted seconds for one all-reduce of `n_bytes` over `world_size` processes.

    Args:
        algorithm: "ring", "tree" or "ps".
        n_bytes: bytes each process contributes (the gradient size).
        world_size: number of processes P.
        alpha: latency per message in seconds.
        beta: seconds per byte on a link.
        fanout: tree fanout k (tree only).
        chunk_bytes: tree pipeline chunk size (tree only).
        num_servers: parameter-server shards K (ps only).
        piece_bytes: largest parameter-server message (ps only).

    Example:

    >>> predict_all_reduce_seconds("ring", 4 << 20, 4, alpha=1e-4, beta=1e-9)
    0.00689...
    """
    if algorithm == "ring":
        return ring_seconds(n_bytes, world_size, alpha, beta)
    if algorithm == "tree":
        return tree_seconds(n_bytes, world_size, alpha, beta, fanout, chunk_bytes)
    if algorithm == "ps":
        return parameter_server_seconds(n_bytes, world_size, alpha, beta, num_servers,
                                        piece_bytes)
    raise ValueError(f"algorithm must be one of {ALGORITHMS}. Got: {algorithm!r}")
