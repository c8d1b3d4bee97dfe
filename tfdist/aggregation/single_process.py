"""Aggregation in a job with one training process: the sum over one rank is the tensor.

Used when there is nothing to aggregate (one worker and no dedicated
parameter server). Nothing is sent, so gradient compression does not apply
either (`communicates` is False), and the step is Keras' own.

Cost model: zero. Guarantee: the result is the input, bit for bit.
"""

from tfdist.aggregation.base import Aggregator


class SingleProcessAggregator(Aggregator):
    """The identity; see the module docstring."""

    name = "none"
    communicates = False

    def __init__(self, communicator=None):
        del communicator  # same signature as the others: nothing to talk to
        super().__init__()

    def reduce_bucket(self, bucket):
        return list(bucket.tensors)

    @classmethod
    def predict_seconds(cls, n_bytes, world_size, alpha, beta):
        del n_bytes, world_size, alpha, beta
        return 0.0
