"""The default optimizer-state mode: every rank holds the whole optimizer state.

Every rank applies the same global gradients to the same state with Keras'
own `apply`, so every rank ends each step with the same weights and slots:
a save needs only the chief, a backup restores by broadcast, and the
consistency check compares everything. Cost: s bytes of optimizer state on
every rank (`ShardedOptimizerState` keeps s / P).
"""

import contextlib

from tfdist.strategies.modes import layout


class ReplicatedOptimizerState:
    """Whole optimizer state on every rank; see the module docstring."""

    every_rank_saves = False
    sharding = None

    def create(self, create, kwargs, communicator):
        del communicator
        return create(kwargs)

    def layout(self, variable):
        return layout.whole_or_own(variable)

    def reduced_in_backward(self, variable):
        del variable
        return False

    def check_compression(self, compression_name, rank):
        del compression_name, rank  # any compression

    def begin_build(self, optimizer, variables, context):
        del optimizer, variables, context

    def end_build(self, optimizer):
        del optimizer

    def scatter_target(self, optimizer):
        del optimizer
        return None  # gradients all-reduced whole

    def apply(self, optimizer, apply, grads, variables):
        return apply(optimizer, grads, variables)

    def refuse_local_gradients(self, optimizer):
        del optimizer

    def rank_local_slots(self, model):
        return layout.sliced(model, self)  # none

    def consolidated(self, model):
        del model
        return contextlib.nullcontext()

    def keeping_loaded(self, model):
        del model
        return contextlib.nullcontext()

    def share_loaded(self, model, root=0):
        del model, root  # every rank's variables were broadcast whole

    def state_savers(self, callbacks):
        del callbacks
        return None  # the chief alone saves (Horovod's convention works)

    def different_savers_error(self, savers_by_rank, rank):
        return AssertionError(f"tfdist rank {rank}: checkpoint callbacks are not compared "
                              f"without sharding (by rank: {savers_by_rank})")
