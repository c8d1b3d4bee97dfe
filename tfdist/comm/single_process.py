"""The communicator of a job with one training process: every collective is the identity.

A script run as one plain process (or as the only worker of a job with
dedicated parameter servers) goes through the same code as a multi-process
job; here a sum over one rank is the tensor itself, a gather is the tensor,
a broadcast from rank 0 is the tensor. Nothing is sent and nothing waits, so
there is nothing to watch. Cost: zero (no ops are added).
"""

from typing import List, Sequence

import tensorflow as tf

from tfdist.comm.base import Communicator


class SingleProcessCommunicator(Communicator):
    """Rank 0 of a world of one; see the module docstring."""

    engine = "single-process"

    def all_reduce(self, tensor: tf.Tensor) -> tf.Tensor:
        return tensor

    def grouped_all_reduce(self, tensors: Sequence[tf.Tensor]) -> List[tf.Tensor]:
        return list(tensors)

    def all_gather(self, tensor: tf.Tensor) -> tf.Tensor:
        return tensor

    def broadcast(self, tensor: tf.Tensor, root: int = 0) -> tf.Tensor:
        if root != 0:
            raise ValueError(f"a single process has only rank 0 to broadcast from. Got: {root!r}")
        return tensor

    def barrier(self) -> None:
        pass
