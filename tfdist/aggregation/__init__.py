"""Gradient-aggregation algorithms: one file each, one interface (`Aggregator`)."""

from tfdist.aggregation.base import Aggregator
from tfdist.aggregation.fusion import FusionPlan
from tfdist.aggregation.ring import RingAllReduceAggregator
from tfdist.aggregation.tree import KaryTree, ReductionTreeAggregator
from tfdist.aggregation.cost_model import predict_all_reduce_seconds
