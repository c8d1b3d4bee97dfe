"""Gradient-aggregation algorithms: one file each, one interface (`Aggregator`)."""

from tfdist.aggregation.base import Aggregator
from tfdist.aggregation.fusion import FusionPlan
from tfdist.aggregation.ring import RingAllReduceAggregator
