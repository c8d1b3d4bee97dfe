"""tfdist: multi-process data-parallel training for Keras 3 on TensorFlow."""

__version__ = "0.1.0"

from tfdist import callbacks  # noqa: E402
from tfdist import cluster  # noqa: E402
from tfdist import strategies  # noqa: E402
