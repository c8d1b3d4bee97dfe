"""One rank's variable values on every rank: the variables flattened per dtype, one broadcast each.

Used where the values of variables a rank created on its own must become
the same everywhere: Horovod's `broadcast_variables` and callbacks
(`tfdist.horovod`), and the start of `fit` under a per-rank-input strategy,
whose variables are each rank's own from creation, as in Horovod
(`DataParallelExtended._create_variable`). The dtypes go in name order and
the variables in the order given, which every rank gives alike (a model's
`weights`, an optimizer's `variables`).

Cost: one broadcast per dtype of all the variables' bytes, 2 log P alpha +
n beta with a tree broadcast; eagerly or inside a `tf.function`.
"""

import tensorflow as tf


def broadcast_variables(communicator, variables, root=0):
    """Assign `root`'s value to each of `variables` (a list of `tf.Variable`s)."""
    by_dtype = {}
    for variable in variables:
        by_dtype.setdefault(tf.as_dtype(variable.dtype), []).append(variable)
    for dtype in sorted(by_dtype, key=lambda d: d.name):  # the same order on every rank
        group = by_dtype[dtype]
        flat = tf.concat([tf.reshape(tf.convert_to_tensor(v), [-1]) for v in group], axis=0)
        flat = communicator.broadcast(flat, root=root)
        offset = 0
        for variable in group:
            count = int(tf.size(variable))
            variable.assign(tf.reshape(flat[offset:offset + count], variable.shape))
            offset += count
