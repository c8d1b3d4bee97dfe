"""tfdist: multi-process data-parallel training for Keras 3 on TensorFlow.

Submodules are imported on first use, so that light tools (`tfdist-run`,
cluster parsing) start without loading TensorFlow. Importing tfdist refuses
a Keras or TensorFlow outside the supported range (`tfdist.versions`).
"""

import importlib

from tfdist.process_setup import quiet_output as _quiet_output
from tfdist import versions as _versions

__version__ = "0.1.0"

_versions.check_installed(__version__)  # a Keras or TensorFlow outside the range: ImportError

_quiet_output.before_tensorflow()  # TensorFlow's start-up notices, if it is not imported yet

_SUBMODULES = ("aggregation", "callbacks", "cluster", "comm", "compression", "fault_tolerance",
               "optimizers", "process_setup", "profiling", "runtime", "strategies")


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"tfdist.{name}")
    raise AttributeError(f"module 'tfdist' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_SUBMODULES))
