"""`compile`: Keras 2's `experimental_run_tf_function` accepted where Horovod's scripts pass it.

Every Horovod Keras script compiles with
`model.compile(..., experimental_run_tf_function=False)` (Keras 2 needed it
for `DistributedOptimizer` to see the gradients). Keras 3's `compile` has
no such argument and raises a TypeError. For a model built under a
per-rank-input tfdist strategy (`tfdist.horovod.keras`), the argument is
accepted and ignored, said once on the chief: tfdist makes the gradients
global inside Keras 3's own step, compiled or eager. Any other model gets
Keras' own `compile`, TypeError included.

Cost: none after `compile`.
"""

import functools

from tfdist import chief_log
from tfdist.strategies.keras_patches import patch_points
from tfdist.strategies.keras_patches.model_strategy import tfdist_strategy

KERAS_2_ARGUMENT = "experimental_run_tf_function"


def install():
    """Accept `experimental_run_tf_function` in a Horovod-API model's `compile`."""
    compile_model = patch_points.original("BaseTrainer", "compile")

    @functools.wraps(compile_model)  # check_keras reads the original through it
    def compile_accepting_keras_2(self, *args, **kwargs):
        strategy = tfdist_strategy(self)
        if (KERAS_2_ARGUMENT in kwargs and strategy is not None
                and strategy.extended.per_rank_input):
            value = kwargs.pop(KERAS_2_ARGUMENT)
            chief_log.info(strategy.is_chief,
                           "tfdist.horovod.keras: compile(%s=%r) ignored: Keras 3 has no such "
                           "argument; the gradients are averaged inside Keras' own step",
                           KERAS_2_ARGUMENT, value, once=True)
        return compile_model(self, *args, **kwargs)

    patch_points.replace("BaseTrainer", "compile", compile_accepting_keras_2)
