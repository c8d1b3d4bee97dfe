"""tfdist: multi-process data-parallel training for Keras 3 on TensorFlow.

Submodules are imported on first use, so that light tools (`tfdist-run`,
cluster parsing) start without loading TensorFlow. Importing tfdist refuses
a Keras or TensorFlow outside the supported range (`tfdist.versions`), and,
in a program other than tfdist's own tools, a Python without TensorFlow or
Keras, naming the install extra (a script's `import tfdist; import keras`
would otherwise die on a bare "No module named 'keras'").
"""

import importlib
import os
import sys

from tfdist.process_setup import quiet_output as _quiet_output
from tfdist import versions as _versions

__version__ = "0.1.0"

_versions.check_installed(__version__)  # a Keras or TensorFlow outside the range: ImportError
# tfdist's own tools run without TensorFlow (the launcher on a machine that only starts jobs):
# their console scripts, or `python -m tfdist.<tool>` (sys.argv[0] is "-m" while it loads).
_OWN_TOOLS = ("tfdist-run", "tfdist-bench")
if not (sys.argv[:1] == ["-m"] or os.path.basename(sys.argv[0] if sys.argv else "")
        in _OWN_TOOLS):
    _versions.require_tensorflow()  # missing: a ModuleNotFoundError naming the extra

_quiet_output.before_tensorflow()  # TensorFlow's start-up notices, if it is not imported yet

_SUBMODULES = ("aggregation", "callbacks", "cluster", "comm", "compression", "fault_tolerance",
               "optimizers", "process_setup", "profiling", "runtime", "strategies")


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"tfdist.{name}")
    raise AttributeError(f"module 'tfdist' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_SUBMODULES))
