"""Flags every rank agrees on at a training step, carried by the step's fused all-reduce.

A rank raises a flag from the host at any time (a preemption notice:
`preemption`). Before its next training step the flag is written into a
small variable; the step adds that variable to its one all-reduce
(`step_sum.StepSum`, as the communication counters do) and stores the sums
in a second variable. So after that step every rank reads the same sums:
a flag raised on any rank is seen by all of them, after the same step,
with no collective added. One process runs Keras' own step (nothing is
summed): its own flags are the agreed ones.

The asynchronous parameter server's workers are not in step and share no
collective: a worker's push carries its raised flags to the servers as
bits (`step_bits`), and every pull reply carries the bits any worker
pushed (`async_store`); a step's agreed flags are this worker's own and
those its pull brought (`absorb_bits`). A flag raised on one worker is
then seen by every worker at its next step after the one that pushed it.

The same vector carries each rank's fingerprint of its weights at an epoch
end (`post_fingerprint`: two floats in the rank's own slots, zeros in the
others', so the sum holds every rank's exactly), read after the next step
(`fingerprints`; `replica_consistency`).

Cost: `len(NAMES)` + 2 P floats in every training step's all-reduce; one
variable read after a step, only where a flag is watched.
"""

import threading

import tensorflow as tf

NAMES = ("preempt",)
PREEMPT = NAMES.index("preempt")


class AgreedFlags:
    """This rank's raised flags, and the flags the last training step agreed on.

    Args:
        world_size: the number of training processes (1: nothing is exchanged).
    """

    def __init__(self, world_size, rank=0):
        self._exchanged = world_size > 1
        self._raised = [False] * len(NAMES)  # host side: set at any time, by any thread
        self._written = [False] * len(NAMES)
        self._fingerprint = None  # two floats waiting to be written (`post_fingerprint`)
        self._fingerprint_slot = len(NAMES) + 2 * rank
        self._lock = threading.Lock()
        size = len(NAMES) + 2 * world_size if self._exchanged else len(NAMES)
        with tf.init_scope():
            self._local = tf.Variable(tf.zeros([size]), trainable=False,
                                      name="tfdist_raised_flags")
            self._agreed = tf.Variable(tf.zeros([size]), trainable=False,
                                       name="tfdist_agreed_flags")

    def raise_flag(self, index):
        """Raise flag `index` on this rank (host side; safe from a signal handler)."""
        self._raised[index] = True

    def lower_flag(self, index):
        """Lower flag `index` on this rank (it was acted on)."""
        self._raised[index] = False

    def post_fingerprint(self, halves):
        """This rank's weights fingerprint (two floats) joins the next step's sums (host)."""
        if self._exchanged:
            self._fingerprint = list(halves)

    def fingerprints(self):
        """Every rank's posted fingerprint halves, in rank order, as the last step summed them."""
        return [float(v) for v in self._agreed.numpy()[len(NAMES):]]

    def before_step(self):
        """Write newly raised flags where the next step reads them (host, before a step)."""
        if self._raised == self._written and self._fingerprint is None:
            return
        with self._lock:
            self._written = list(self._raised)
            self._local[:len(NAMES)].assign([1.0 if raised else 0.0 for raised in self._written])
            if self._fingerprint is not None:
                slot = self._fingerprint_slot
                self._local[slot:slot + 2].assign(self._fingerprint)
                self._fingerprint = None

    # -------------------------------------------------------------- in the step
    def step_vector(self):
        """This rank's flags, for the step's all-reduce."""
        return self._local.read_value()

    def absorb(self, summed):
        """Store the step's sums of every rank's flags; the assignment op."""
        return self._agreed.assign(summed)

    def step_bits(self):
        """This rank's flags as the bits of an int64 (bit i: flag i), for a push."""
        raised = tf.cast(self._local.read_value()[:len(NAMES)] > 0, tf.int64)
        return tf.reduce_sum(raised * tf.constant([1 << i for i in range(len(NAMES))], tf.int64))

    def absorb_bits(self, bits):
        """Store this rank's flags joined with the bits the servers sent; the assignment op."""
        pulled = tf.cast(tf.bitwise.bitwise_and(
            tf.bitwise.right_shift(tf.cast(bits, tf.int64), tf.range(len(NAMES), dtype=tf.int64)),
            1), tf.float32)
        return self._agreed[:len(NAMES)].assign(
            tf.maximum(self._local.read_value()[:len(NAMES)], pulled))

    # ---------------------------------------------------------------- after a step
    def agreed(self, index):
        """Whether any rank had raised flag `index` by the last training step."""
        if not self._exchanged:
            return self._raised[index]
        return bool(self._agreed[index].numpy() > 0)
