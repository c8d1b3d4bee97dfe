"""Keras 3 optimizers for large-batch training."""

from tfdist.optimizers.lars import LARS

__all__ = ["LARS"]
