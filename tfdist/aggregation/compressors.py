"""Compressors by name, and wrapping an aggregator in one (`with_compression`)."""

from tfdist.aggregation.compression import CompressedAggregator, Compressor, FP16Compression
from tfdist.aggregation.topk import TopK

COMPRESSORS = {"fp16": FP16Compression, "topk": TopK}


def get_compressor(compression):
    """The `Compressor` for `compression` (a name of `COMPRESSORS`, an instance), or None
    for None / "none"."""
    if compression is None or compression == "none":
        return None
    if isinstance(compression, str):
        if compression not in COMPRESSORS:
            raise ValueError(f"compression must be one of {sorted(COMPRESSORS) + ['none']} "
                             f"or None. Got: {compression!r}")
        return COMPRESSORS[compression]()
    if isinstance(compression, Compressor):
        return compression
    raise ValueError("compression must be a name or a tfdist.aggregation.compression.Compressor. "
                     f"Got: {compression!r}")


def with_compression(aggregator, compression):
    """`aggregator`, wrapped in a `CompressedAggregator` when `compression` names a compressor
    and something goes on a wire (one process sends nothing: nothing to compress)."""
    compressor = get_compressor(compression)
    if compressor is None or not aggregator.communicates:
        return aggregator
    return CompressedAggregator(aggregator, compressor)
