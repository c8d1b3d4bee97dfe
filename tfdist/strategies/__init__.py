"""tf.distribute strategies for multi-process Keras 3 training."""

from tfdist import versions as _versions

_versions.require_tensorflow()  # missing: an error that names the install extra

from tfdist.strategies.data_parallel import DataParallelStrategy
from tfdist.strategies.parameter_server import ParameterServerStrategy
from tfdist.strategies.ring import RingAllReduceStrategy
from tfdist.strategies.tree import ReductionTreeStrategy

__all__ = ["DataParallelStrategy", "RingAllReduceStrategy", "ReductionTreeStrategy",
           "ParameterServerStrategy"]
