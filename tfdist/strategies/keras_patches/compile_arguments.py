"""`compile`: Keras 2's `experimental_run_tf_function` accepted where Horovod's scripts pass it.

Every Horovod Keras script compiles with
`model.compile(..., experimental_run_tf_function=False)` (Keras 2 needed it
for `DistributedOptimizer` to see the gradients). Keras 3's `compile` has
no such argument and raises a TypeError. A model built under a tfdist
strategy gets its `compile` arguments through the strategy's input mode:
under Horovod's semantics (`modes.PerRankInput`, `tfdist.horovod.keras`)
the argument is accepted and ignored, said once on the chief (tfdist makes
the gradients global inside Keras 3's own step, compiled or eager). A model
outside every tfdist strategy compiled with it in a process that created a
multi-process one (a Horovod script that built its model before
`hvd.init()`) is refused naming that cause; any other model gets Keras' own
`compile`, TypeError included.

Cost: none after `compile`.
"""

import functools

from tfdist.strategies.keras_surface import patch_points
from tfdist.strategies.keras_surface.model_strategy import (refuse_training_outside_scope,
                                                            tfdist_strategy)

from tfdist.strategies.keras_surface.compat import KERAS_2_ARGUMENT  # noqa: E402


def install():
    """A model's `compile` takes its arguments as its strategy's input mode accepts them
    (`InputMode.compile_arguments`: per-rank input, Horovod's, drops
    `experimental_run_tf_function`)."""
    compile_model = patch_points.original("BaseTrainer", "compile")

    @functools.wraps(compile_model)  # check_keras reads the original through it
    def compile_accepting_keras_2(self, *args, **kwargs):
        strategy = tfdist_strategy(self)
        if strategy is not None:
            kwargs = strategy.extended.input_mode.compile_arguments(kwargs, strategy)
        elif KERAS_2_ARGUMENT in kwargs:
            # A Horovod script's model built before hvd.init() (or outside the scope): the real
            # cause, not Keras' TypeError about the argument.
            refuse_training_outside_scope(self, "fit")
        return compile_model(self, *args, **kwargs)

    patch_points.replace("BaseTrainer", "compile", compile_accepting_keras_2)
