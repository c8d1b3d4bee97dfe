"""Batch dependence is decided the same way traced and eager
(`tfdist.strategies.step.batch_dependence`).

Each case computes the same thing from a step's inputs twice - inside a
`tf.function` (the graph walk) and eagerly under `BatchLineage.recording`
(the op callbacks) - and both must give the same answer: what reads the
batch (an Embedding of the input tokens, a `Dense` layer on a `SparseTensor`)
and what does not (a position embedding, a sequence length), which indices
were made unique before their lookup, and the denominator of a hand-written
ratio with its guard.
"""

import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.strategies.step.batch_dependence import BatchLineage

TOKENS = np.array([[3, 1, 4, 1], [5, 9, 2, 6], [5, 3, 5, 8]], dtype="int32")


def both_ways(compute, inputs):
    """`compute(lineage, inputs)` traced and eager: the two answers."""
    answers = []

    def any_rows(value):  # as Keras traces a step: for any batch size
        spec = tf.type_spec_from_value(value)
        if isinstance(spec, tf.TensorSpec):
            return tf.TensorSpec([None] + spec.shape[1:].as_list(), spec.dtype)
        return spec

    @tf.function(input_signature=[tf.nest.map_structure(any_rows, inputs)])
    def traced(batch):
        lineage = BatchLineage(batch)
        answers.append(compute(lineage, batch))
        return tf.constant(0)

    traced(inputs)
    lineage = BatchLineage(inputs)
    with lineage.recording():
        answers.append(compute(lineage, inputs))
    return answers


def embedding_gradient_indices(table, ids):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, ids))
    return tape.gradient(loss, table).indices


def test_token_lookups_read_the_batch_and_position_lookups_do_not():
    table = tf.Variable(tf.ones([10, 2]))

    def decide(lineage, tokens):
        token_indices = embedding_gradient_indices(table, tf.reshape(tokens, [-1]))
        length = tf.shape(tokens)[1]  # a sequence length: the same on every rank
        position_indices = embedding_gradient_indices(table, tf.range(length))
        return (lineage.reads_batch(token_indices), lineage.reads_batch(position_indices),
                lineage.reads_batch(tf.shape(tokens)[0]))

    assert both_ways(decide, tf.constant(TOKENS)) == [(True, False, True)] * 2


def test_every_component_of_composite_inputs_counts():
    sparse = tf.sparse.from_dense(tf.constant([[0.0, 2.0], [1.0, 0.0]]))
    ragged = tf.ragged.constant([[1, 2], [3]])

    def decide(lineage, batch):
        columns = batch["sparse"].indices[:, 1]
        return (lineage.reads_batch(columns * 2),
                lineage.reads_batch(batch["ragged"].values + 1),
                lineage.reads_batch(tf.constant(1) + 1))

    assert both_ways(decide, {"sparse": sparse, "ragged": ragged}) == [(True, True, False)] * 2


def test_indices_made_unique_before_their_lookup_are_found():
    """Keras multiplies a SparseTensor input through `embedding_lookup_sparse`, which looks
    up `tf.unique` of the column ids: one process holds each index once."""
    kernel = tf.Variable(tf.ones([4, 3]))

    def decide(lineage, batch):
        with tf.GradientTape() as tape:
            ids = tf.SparseTensor(batch.indices, batch.indices[:, 1], batch.dense_shape)
            loss = tf.reduce_sum(tf.nn.embedding_lookup_sparse(kernel, ids, batch,
                                                               combiner="sum"))
        indices = tape.gradient(loss, kernel).indices
        plain = embedding_gradient_indices(kernel, batch.indices[:, 1])
        return lineage.looked_up_once(indices), lineage.looked_up_once(plain)

    batch = tf.sparse.from_dense(tf.constant([[1.0, 0.0, 2.0, 0.0], [0.0, 0.0, 3.0, 1.0]]))
    assert both_ways(decide, batch) == [(True, False)] * 2


def test_hand_written_ratios_and_their_guards_are_found():
    def decide(lineage, batch):
        losses, weights = batch
        ratio = tf.reduce_sum(losses * weights) / tf.maximum(tf.reduce_sum(weights), 1.0)
        plain_ratio = tf.reduce_sum(losses) / tf.reduce_sum(weights)
        mean = tf.reduce_mean(losses)
        by_constant = tf.reduce_sum(losses) / 4.0
        found = lineage.ratio_denominator(ratio)
        total = found.outer(tf.constant(0.5))  # the guard applied to a global sum
        plain = lineage.ratio_denominator(plain_ratio)
        return (float(total) if tf.executing_eagerly() else "traced",
                plain.inner is plain.local, lineage.ratio_denominator(mean),
                lineage.ratio_denominator(by_constant))

    traced, eager = both_ways(decide, (tf.constant([1.0, 2.0]), tf.constant([0.0, 1.0])))
    assert traced[1:] == eager[1:] == (True, None, None)
    assert eager[0] == 1.0  # max(0.5, 1)


def test_an_eager_lineage_sees_every_op_while_other_threads_record_theirs():
    """TensorFlow switches its eager slow path's callbacks off process-wide when any thread
    removes its last one; each thread's lineage must still see all of its own ops."""
    missed = []

    def run():
        tokens = tf.constant(TOKENS)
        for _ in range(150):
            lineage = BatchLineage(tokens)
            with lineage.recording():
                reshaped = tf.reshape(tokens * 1, [-1])  # a list shape: the slow path
            if not lineage.reads_batch(reshaped):
                missed.append(1)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not missed


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_keras_own_losses_are_no_hand_written_ratio(reduction):
    """A `keras.losses` mean divides a sum by the elements: no ratio to make global (that
    would cost a collective per step)."""
    loss = keras.losses.MeanSquaredError(reduction="sum_over_batch_size" if reduction == "mean"
                                         else "sum")

    def decide(lineage, batch):
        return lineage.ratio_denominator(loss(batch[0], batch[1]))

    assert both_ways(decide, (tf.ones([3, 2]), tf.zeros([3, 2]))) == [None, None]
