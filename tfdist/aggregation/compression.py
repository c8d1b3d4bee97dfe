"""Gradient compression on the wire: what an aggregator sends instead of the gradient.

`FP16Compression` casts floating-point gradients wider than 16 bits to
float16 before aggregation and back to their dtype after, halving the bytes
every algorithm moves (cost model: beta term x 1/2, plus two casts, memory
traffic 3n/2 per tensor). Guarantee relative to the exact sum: each
gradient is rounded to float16 (relative error <= 2^-11) and summed in
float16, so the result differs from the float32 sum by about
P * 2^-11 * max |g| and overflows past 65504; Keras' loss scaling by
1 / num_replicas keeps summed gradients in range for ordinary losses.
Non-float tensors pass unchanged. Used only for gradients (values reduced
through `batch_reduce_to`), never for metric state.
"""

import tensorflow as tf


class NoCompression:
    """Send tensors as they are."""

    name = "none"

    def compress(self, tensor):
        return tensor, None

    def decompress(self, tensor, context):
        del context
        return tensor


class FP16Compression:
    """Send floating-point tensors as float16 (half the bytes)."""

    name = "fp16"

    def compress(self, tensor):
        if tensor.dtype.is_floating and tensor.dtype.size > 2:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    def decompress(self, tensor, context):
        return tensor if context is None else tf.cast(tensor, context)


COMPRESSIONS = {"none": NoCompression, "fp16": FP16Compression}


def get_compression(compression):
    """The compression for `compression` ("none", "fp16", None or an instance)."""
    if compression is None:
        return NoCompression()
    if isinstance(compression, str):
        if compression not in COMPRESSIONS:
            raise ValueError(
                f"compression must be one of {sorted(COMPRESSIONS)} or None. Got: {compression!r}"
            )
        return COMPRESSIONS[compression]()
    if hasattr(compression, "compress") and hasattr(compression, "decompress"):
        return compression
    raise ValueError(f"compression must be a name or have compress/decompress. Got: {compression!r}")
