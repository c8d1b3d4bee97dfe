"""`tf.nn.compute_average_loss` in a custom loop divides by the real global batch.

The TensorFlow guide's custom loop scales its loss with
`tf.nn.compute_average_loss(per_example_loss)`. Without `global_batch_size`
TensorFlow takes the global batch to be this replica's rows times
`num_replicas_in_sync` - true only when every replica holds the same number
of rows. tfdist splits a global batch of any size unevenly (a last partial
batch, 44 rows over 3 processes: 14/15/15), where that guess divides each
rank's sum by another number, and the update differs from one process's.
Inside a tfdist step of a multi-process job the global batch is instead
the sum over ranks of the per-example losses' rows: one small all-reduce
per call, and the same result as one process for any split. An explicit
`global_batch_size` is used as given.
"""

import tensorflow as tf

from tfdist import _tf
from tfdist.strategies.step import replica_step

_installed = [False]


def install(in_multi_process_step):
    """Replace `tf.nn.compute_average_loss` (once per process).

    `in_multi_process_step()`: True inside a user's function run by a
    multi-process tfdist strategy (`ReplicaStep.scaled_by_user`).
    """
    if _installed[0]:
        return
    _installed[0] = True
    original = _tf.original("tf.nn", "compute_average_loss")

    @tf.autograph.experimental.do_not_convert  # tfdist's step code runs as written
    def compute_average_loss(per_example_loss, sample_weight=None, global_batch_size=None):
        step = replica_step.current()
        if global_batch_size is None and step is not None and in_multi_process_step(step):
            per_example_loss = tf.convert_to_tensor(per_example_loss)
            rows = tf.cast(tf.shape(per_example_loss)[0], tf.float32)
            global_batch_size = tf.cast(tf.round(step.sum_over_ranks(rows)), tf.int64)
        return original(per_example_loss, sample_weight=sample_weight,
                        global_batch_size=global_batch_size)

    compute_average_loss.__doc__ = original.__doc__
    _tf.replace("tf.nn", "compute_average_loss", compute_average_loss)
