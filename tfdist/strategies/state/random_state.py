"""Give every rank the same random state, so host-side shuffles agree.

Data sharding gives each rank a slice of the *same* global batch, which
holds only if every rank draws the same batch order. TensorFlow shuffles
(`Dataset.shuffle`, Keras' `shuffle=True` for arrays) use TensorFlow's global
seed; Python-side pipelines (`keras.utils.PyDataset`, generators, a user's
`random.shuffle` or `np.random.permutation`) use Python's `random` and NumPy's
global generator. At strategy creation all three are aligned with rank 0:

* TensorFlow: rank 0's seed proposal, unless the user set a global seed;
* Python `random` and NumPy's global `RandomState`: rank 0's full state.
  A user who seeded them identically on every rank keeps the same stream
  (rank 0's state is then everyone's state); an unseeded run gets rank 0's
  stream everywhere, as one process would have its own.

Cost: three broadcasts (a seed, 1253 integers, 2 floats), once per process.
"""

import random

import numpy as np
import tensorflow as tf

from tfdist import _tf


def align_random_state(communicator):
    """Make TensorFlow's seed and Python's/NumPy's global generators equal rank 0's."""
    proposal = tf.constant(random.SystemRandom().randrange(2**31), tf.int64)
    seed = int(communicator.broadcast(proposal).numpy())
    if not _tf.global_seed_is_set():
        tf.random.set_seed(seed)
    integers, floats = _pack(random.getstate(), np.random.get_state())
    integers = communicator.broadcast(tf.constant(integers, tf.int64)).numpy()
    floats = communicator.broadcast(tf.constant(floats, tf.float64)).numpy()
    python_state, numpy_state = _unpack(integers, floats)
    random.setstate(python_state)
    np.random.set_state(numpy_state)


def _pack(python_state, numpy_state):
    version, python_words, python_gauss = python_state
    _, numpy_words, position, has_gauss, cached_gauss = numpy_state
    integers = ([version] + list(python_words) + [python_gauss is not None]
                + [int(w) for w in numpy_words] + [position, has_gauss])
    floats = [python_gauss or 0.0, cached_gauss]
    return integers, floats


def _unpack(integers, floats):
    integers = [int(i) for i in integers]
    python_words = tuple(integers[1:626])
    python_gauss = float(floats[0]) if integers[626] else None
    numpy_words = np.array(integers[627:627 + 624], dtype=np.uint32)
    position, has_gauss = integers[627 + 624], integers[627 + 625]
    return ((integers[0], python_words, python_gauss),
            ("MT19937", numpy_words, position, has_gauss, float(floats[1])))
