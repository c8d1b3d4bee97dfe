"""Horovod's `Compression`: `Compression.none` and `Compression.fp16`.

`DistributedOptimizer(compression=...)` hands them to the strategy's
gradient path as tfdist's compressions (`None`, `"fp16"`: float gradients
travel as float16 and are cast back after the sum, half the bytes; see
`tfdist.aggregation.compressors`). `allreduce(..., compression=...)` uses
`compress` / `decompress` directly, as Horovod's do.
"""

import tensorflow as tf


class NoneCompressor:
    """No compression: the tensor travels as it is."""

    tfdist_name = None

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        del ctx
        return tensor


class FP16Compressor:
    """Floating-point tensors travel as float16 and are cast back to their dtype."""

    tfdist_name = "fp16"

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tf.cast(tensor, ctx) if ctx is not None and ctx != tensor.dtype else tensor


class Compression:
    """Horovod's compression choices (`hvd.Compression.none`, `hvd.Compression.fp16`)."""

    none = NoneCompressor
    fp16 = FP16Compressor


def tfdist_compression(compression):
    """The strategy's name for a Horovod compression; ValueError for anything else."""
    name = getattr(compression, "tfdist_name", "unknown")
    if name == "unknown":
        raise ValueError("tfdist.horovod: compression must be hvd.Compression.none or "
                         f"hvd.Compression.fp16. Got: compression={compression!r}")
    return name
