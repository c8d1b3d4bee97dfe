"""Gradient-aggregation algorithms: one module each, one interface (`Aggregator`, a
communication hook that receives `Bucket`s and owns its cost model)."""

from tfdist import versions as _versions

_versions.require_tensorflow()  # missing: an error that names the install extra

from tfdist.aggregation.base import (EXACT, GRADIENT, GRADIENTS, ROLES, ROWS, STATE, Aggregator,
                                     Bucket)
from tfdist.aggregation.cost_model import predict_all_reduce_seconds
from tfdist.aggregation.fusion import FusionPlan
from tfdist.aggregation.parameter_server import ParameterServerAggregator
from tfdist.aggregation.recommend import Recommendation, recommend
from tfdist.aggregation.ring import RingAllReduceAggregator
from tfdist.aggregation.single_process import SingleProcessAggregator
from tfdist.aggregation.tree import KaryTree, ReductionTreeAggregator

# GRADIENT / EXACT / ROWS: what each tensor of a bucket is (`Bucket.roles`, the contract a
# hook keeps); GRADIENTS / STATE: a bucket's kind, only in its name scope (`Bucket.kind`).
__all__ = ["Aggregator", "Bucket", "GRADIENT", "EXACT", "ROWS", "ROLES", "GRADIENTS", "STATE",
           "FusionPlan", "KaryTree",
           "ParameterServerAggregator", "ReductionTreeAggregator", "RingAllReduceAggregator",
           "SingleProcessAggregator", "Recommendation", "predict_all_reduce_seconds", "recommend"]
