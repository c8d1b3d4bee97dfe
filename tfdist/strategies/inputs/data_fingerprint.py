"""A cheap fingerprint of in-memory training data, to tell whether ranks hold the same data.

tfdist gives every rank its slice of every *global* batch, so every rank
must pass the same full data to `fit`. A Horovod user's habit - each rank
keeping only its shard (`x[rank::world]`) - has the same number of batches
on every rank when the shards are equal in size, and would silently train
on 1/P of the rows. Comparing the fingerprints of the ranks' arrays once per
`fit`/`evaluate`/`predict` catches it (`DataParallelExtended.check_same_data`).

The fingerprint is the row count and a hash of up to `SAMPLED_ROWS` rows at
evenly spaced positions of every array (their bytes, shapes and dtypes), so
different shards, orders or contents almost surely differ.

Cost: reading and hashing up to 16 rows per array, once per call.
"""

import hashlib

import numpy as np

SAMPLED_ROWS = 16


def array_fingerprint(arrays):
    """(rows, 63-bit hash) of a list of array-likes with a common first dimension, or None.

    None when there is nothing to fingerprint or an array cannot be read
    as NumPy (then nothing is compared).
    """
    arrays = [a for a in arrays if a is not None]
    if not arrays:
        return None
    try:
        rows = int(np.shape(arrays[0])[0])
        positions = np.unique(np.linspace(0, max(rows - 1, 0), num=min(rows, SAMPLED_ROWS))
                              .astype(np.int64)) if rows else np.zeros([0], np.int64)
        digest = hashlib.blake2b(digest_size=8)
        for array in arrays:
            sampled = np.ascontiguousarray(np.asarray(_rows(array, positions)))
            digest.update(repr((sampled.shape, str(sampled.dtype))).encode())
            digest.update(sampled.tobytes() if sampled.dtype != object else repr(sampled).encode())
    except (TypeError, ValueError, IndexError, AttributeError):
        return None
    return rows, int.from_bytes(digest.digest(), "little") >> 1


def _rows(array, positions):
    if isinstance(array, np.ndarray):
        return array[positions]
    if hasattr(array, "iloc"):  # pandas
        return array.iloc[positions].to_numpy()
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    return tf.gather(array, positions).numpy()
