"""Gradient-aggregation algorithms: one module each, one interface (`Aggregator`, a
communication hook that receives `Bucket`s and owns its cost model)."""

from tfdist.aggregation.base import GRADIENTS, STATE, Aggregator, Bucket
from tfdist.aggregation.cost_model import predict_all_reduce_seconds
from tfdist.aggregation.fusion import FusionPlan
from tfdist.aggregation.parameter_server import ParameterServerAggregator
from tfdist.aggregation.recommend import Recommendation, recommend
from tfdist.aggregation.ring import RingAllReduceAggregator
from tfdist.aggregation.single_process import SingleProcessAggregator
from tfdist.aggregation.tree import KaryTree, ReductionTreeAggregator

__all__ = ["Aggregator", "Bucket", "GRADIENTS", "STATE", "FusionPlan", "KaryTree",
           "ParameterServerAggregator", "ReductionTreeAggregator", "RingAllReduceAggregator",
           "SingleProcessAggregator", "Recommendation", "predict_all_reduce_seconds", "recommend"]
