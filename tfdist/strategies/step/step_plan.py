"""What kind of step one call of `strategy.run` is, decided once: the `StepPlan`.

A tfdist strategy runs every step in one of four ways; each part of the
step that behaves differently (the strategy's dispatch, the optimizer's
`apply`, the loss reductions) reads this one decision, made when the step
is traced (`plan_step`), instead of flags of its own:

* `LOCAL`: this process runs Keras' step on its own, as one process does -
  one training process (every collective an identity, or, with dedicated
  parameter servers, Keras' own gradient all-reduce through them), or an
  asynchronous worker's evaluate/predict step (each worker reads whole global
  batches); tfdist adds nothing to the step.
* `DEFERRED`: Keras' own `train_step`, which reads no variable after its
  update - the optimizer update waits for the step's end, where its
  gradients join the step's one fused all-reduce (`step_sum`) with the
  metric state and the row count.
* `IMMEDIATE`: any other synchronous step (a custom `train_step`,
  `test_step`, `predict_step`, a user's function in a custom loop) -
  gradients are summed where an optimizer's `apply` is called, the state at
  the step's end.
* `REMOTE`: the asynchronous parameter server's training step - gradients
  are pushed to the servers, which apply them; workers sum nothing.

And who scales the loss for the global batch: tfdist, by weighting every
per-slice mean by its share (Keras' steps), or the user
(`scaled_by_user`: a user's function run by `strategy.run`, whose loss
`tf.nn.compute_average_loss(..., global_batch_size=...)` scales, the
contract of MultiWorkerMirroredStrategy).

Where the user's code sees the global gradient: in an `IMMEDIATE` step the
user's code stands between the backward pass and the update (a custom
`train_step` clipping by global norm, a custom loop logging the norm), so
`GradientTape.gradient` with respect to variables returns the global
batch's gradients there, as on one process (`gradients_global_at_tape`;
the semantics of PyTorch's DDP and Horovod's `DistributedGradientTape`),
and the optimizer's `apply` sums them no more. Keras' own step (`DEFERRED`)
hands its gradients to `apply` untouched, so they wait for the step's fused
all-reduce; an asynchronous worker (`REMOTE`) pushes its own.

Cost: none at run time; the plan exists while a step is traced.
"""

import dataclasses

LOCAL = "local"
DEFERRED = "deferred"
IMMEDIATE = "immediate"
REMOTE = "remote"
UPDATES = (LOCAL, DEFERRED, IMMEDIATE, REMOTE)


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """How one step runs (see the module docstring).

    Attributes:
        updates: `LOCAL`, `DEFERRED`, `IMMEDIATE` or `REMOTE`.
        scaled_by_user: the user's function scales its loss itself.
        training: the step trains (fit's step: its communication is counted
            as training communication).
    """

    updates: str
    scaled_by_user: bool = False
    training: bool = False

    def __post_init__(self):
        if self.updates not in UPDATES:
            raise ValueError(f"updates must be one of {UPDATES}. Got: {self.updates!r}")
        if self.scaled_by_user and self.updates == DEFERRED:
            raise ValueError("a step whose loss the user scales is not Keras' own train_step")

    @property
    def is_remote(self):
        return self.updates == REMOTE

    @property
    def gradients_global_at_tape(self):
        """`GradientTape.gradient` with respect to variables returns the global batch's
        gradients (an `IMMEDIATE` step: the user's code may read them before `apply`)."""
        return self.updates == IMMEDIATE

    @property
    def weights_losses_for_rows_first(self):
        """An aggregator that learns the row count first (`Aggregator.learns_rows_first`)
        may weight every loss by the share in `optimizer.scale_loss` (Keras' own step: no
        user's code adds to the loss between it and the backward pass)."""
        return self.updates == DEFERRED


def plan_step(*, one_process, is_keras_train_step, is_train_step, is_user_function):
    """The `StepPlan` of a step of every rank together (`SynchronousUpdates`).

    Args:
        one_process: one training process.
        is_keras_train_step: the step is Keras' own `train_step`.
        is_train_step: the step is fit's (Keras' own or a custom `train_step`).
        is_user_function: a user's function run by `strategy.run` (not a
            Keras step).
    """
    if one_process:
        updates = LOCAL
    elif is_keras_train_step:
        updates = DEFERRED
    else:
        updates = IMMEDIATE
    return StepPlan(updates, scaled_by_user=is_user_function and updates == IMMEDIATE,
                    training=is_train_step)


def plan_remote_step(*, one_process, is_train_step, is_user_function):
    """The `StepPlan` of a step when servers apply the updates (`AsynchronousUpdates`):
    training steps `REMOTE`, the others run on each worker alone (`LOCAL`)."""
    updates = REMOTE if is_train_step and not one_process else LOCAL
    return StepPlan(updates, scaled_by_user=is_user_function and updates == REMOTE,
                    training=is_train_step)
