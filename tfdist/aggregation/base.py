"""The one interface every gradient-aggregation algorithm implements."""


class Aggregator:
    """Sums a list of tensors across all training processes.

    `all_reduce(tensors)` returns, on every rank, the element-wise sum over
    ranks of each tensor, in the same order and shapes. Implementations
    document their algorithm, their alpha-beta cost model (alpha: per-message
    latency, beta: seconds per byte, n: bytes, P: processes) and what result
    they guarantee relative to an exact sum.
    """

    name = "abstract"

    def all_reduce(self, tensors):
        raise NotImplementedError
