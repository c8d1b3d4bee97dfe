"""`tfdist.cluster` is `tfdist.process_setup.cluster` (the name the documentation used first).

The same module object, not a copy: `tfdist.cluster.discover()` and
`tfdist.process_setup.cluster.discover()` are one function.
"""

import sys

from tfdist.process_setup import cluster as _cluster

sys.modules[__name__] = _cluster
