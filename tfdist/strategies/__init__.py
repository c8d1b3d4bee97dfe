"""tf.distribute strategies for multi-process Keras 3 training.

The folder shows the architecture, top to bottom:

* the public strategies, one module each: `data_parallel`
  (`DataParallelStrategy`, the base), `ring`, `tree`, `parameter_server`;
* `modes`: the three modes each strategy is built from, each one object
  behind a declared interface - the input (global batch | per rank), the
  optimizer state (replicated | sharded), the update (synchronous |
  asynchronous parameter servers);
* `core`: `strategy.extended` (`DataParallelExtended`), which calls the
  modes, and the members the layers above may use of it;
* `step`: one multi-process step (its plan, its rows and weights, the fused
  all-reduce);
* `inputs`: each rank's data, and the checks that ranks were given the same;
* `state`: state across ranks - made global, each rank's own, compared;
* `keras_patches`: every place tfdist changes Keras, declared.
"""

from tfdist import versions as _versions

_versions.require_tensorflow()  # missing: an error that names the install extra

from tfdist.strategies.data_parallel import DataParallelStrategy
from tfdist.strategies.parameter_server import ParameterServerStrategy
from tfdist.strategies.ring import RingAllReduceStrategy
from tfdist.strategies.tree import ReductionTreeStrategy

__all__ = ["DataParallelStrategy", "RingAllReduceStrategy", "ReductionTreeStrategy",
           "ParameterServerStrategy"]
