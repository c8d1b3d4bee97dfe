"""The parameter server: sharded servers that sum what the workers push.

One package, one concern per module:

* `client`: `ParameterServerAggregator`, the workers' aggregation hook
  (algorithm, cost model and guarantee in its docstring);
* `shard_plan`: how a buffer is cut into pieces and spread over the servers;
* `protocol`: the functions a server exposes and what travels through them;
* `shard_server`: `ShardServer`, one shard's queues, reducers and liveness;
* `server_process`: the entry point of a server process (`python -m tfdist.server`);
* `colocated`: a worker's own server as a child process.

Lifecycle: every piece has an explicit `close()` (and works as a context
manager). In a training process `tfdist.runtime.shutdown` closes them at
exit in one fixed order: the workers stop watching their peers, each
worker's aggregator says goodbye to the servers, then a worker waits for its
co-located server, which stops once every worker said goodbye.
"""

from tfdist.aggregation.parameter_server.client import ParameterServerAggregator
from tfdist.aggregation.parameter_server.shard_plan import (DEFAULT_PIECE_BYTES, MIN_SPLIT_BYTES,
                                                            ShardPlan)

__all__ = ["ParameterServerAggregator", "ShardPlan", "DEFAULT_PIECE_BYTES", "MIN_SPLIT_BYTES"]
