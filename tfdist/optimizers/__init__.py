"""Keras 3 optimizers for large-batch training."""

from tfdist import versions as _versions

_versions.require_tensorflow()  # missing: an error that names the install extra

from tfdist.optimizers.lars import LARS

__all__ = ["LARS"]
