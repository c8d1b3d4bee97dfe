"""Compressors by name, and wrapping an aggregator in one (`with_compression`)."""

from tfdist.aggregation.compression import CompressedAggregator, Compressor, FP16Compression
from tfdist.aggregation.powersgd import PowerSGD
from tfdist.aggregation.signsgd import SignSGD
from tfdist.aggregation.topk import TopK

# Each name builds the compressor with its defaults; pass an object for other settings.
COMPRESSORS = {"fp16": FP16Compression, "powersgd": PowerSGD, "topk": TopK, "signsgd": SignSGD}


def get_compressor(compression):
    """The `Compressor` for `compression` (a name of `COMPRESSORS`, an instance), or None
    for None / "none"."""
    if compression is None or compression == "none":
        return None
    if isinstance(compression, str):
        if compression not in COMPRESSORS:
            raise ValueError(f"compression must be one of {sorted(COMPRESSORS) + ['none']}, "
                             f"a tfdist.compression object or None. Got: {compression!r}")
        return COMPRESSORS[compression]()
    if isinstance(compression, Compressor):
        return compression
    if isinstance(compression, type) and issubclass(compression, Compressor):
        raise ValueError(f"compression must be a compressor object, not its class: "
                         f"{compression.__name__}(). Got: {compression!r}")
    raise ValueError("compression must be a name or a tfdist.compression.Compressor. "
                     f"Got: {compression!r}")


def with_compression(aggregator, compression):
    """`aggregator`, wrapped in a `CompressedAggregator` when `compression` names a compressor
    and something goes on a wire (one process sends nothing: nothing to compress)."""
    compressor = get_compressor(compression)
    if compressor is None or not aggregator.communicates:
        return aggregator
    return CompressedAggregator(aggregator, compressor)
