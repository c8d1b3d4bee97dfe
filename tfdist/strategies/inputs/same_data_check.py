"""The check that every rank was given the same data and arguments, in one all-gather.

Each rank must pass fit/evaluate/predict the same arguments, and (under the
global-batch input mode) the same data. If their epochs have different known
lengths, steps would pair up wrongly and the longer rank would wait on a peer
that has finished; if their in-memory arrays differ (each rank passed its own
shard), every rank would train on a slice of its shard: 1/P of the rows; if
their batch sizes differ, each would take its slice of a different global
batch. Where the rules differ by mode, the input mode (`check_batch_counts`,
`check_fingerprints`, `batch_size_rule`) and the optimizer-state mode
(`different_savers_error`) say them.

Cost: one all-gather of 5 + len(call_arguments.ARGUMENTS) integers per
epoch iterator Keras builds.
"""

import tensorflow as tf

from tfdist.strategies.inputs import call_arguments


def check_same_data(communicator, input_mode, optimizer_state, num_batches, fingerprint=None,
                    signature=None):
    """Fail clearly when ranks were given different data or arguments (a silent mismatch
    otherwise).

    `num_batches`: this rank's batches per epoch (None: unknown); `fingerprint`:
    (rows, hash) of its arrays (`data_fingerprint`), or None; `signature`: the
    call's arguments (`call_arguments.call_signature`), or None.
    """
    rows, digest = fingerprint if fingerprint is not None else (-1, -1)
    signature = list(signature) if signature is not None else []
    width = 5 + len(call_arguments.ARGUMENTS)  # the four above, the call, its arguments
    mine = [-1 if num_batches is None else num_batches, rows, digest, len(signature)]
    mine = tf.constant([(mine + signature + [0] * width)[:width]], tf.int64)
    every_rank = communicator.all_gather(mine).numpy().tolist()
    rank = communicator.rank
    signatures = [row[4:4 + row[3]] for row in every_rank]
    if all(signatures) and len({len(s) for s in signatures}) == 1:
        difference = call_arguments.first_difference(signatures)
        if difference is not None:
            name, values = difference
            if name == call_arguments.STATE_SAVERS:
                raise optimizer_state.different_savers_error(values, rank)
            if name == "call":
                raise ValueError(
                    f"tfdist rank {rank}: the ranks are in different calls (by rank: "
                    f"{values}). Every rank must run the same fit/evaluate/predict calls "
                    "in the same order.")
            raise ValueError(
                f"tfdist rank {rank}: the ranks passed different {name!r} (by rank: "
                f"{values}). Every rank must call fit/evaluate/predict with the same "
                f"arguments: {input_mode.batch_size_rule()}")
    input_mode.check_batch_counts([row[0] for row in every_rank], rank)
    input_mode.check_fingerprints([row[1] for row in every_rank],
                                  [(row[1], row[2]) for row in every_rank], rank)
