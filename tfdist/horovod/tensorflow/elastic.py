"""Horovod's `horovod.tensorflow.elastic`: `run`, `TensorFlowKerasState`, `TensorFlowState`.

The same elastic machinery as `tfdist.horovod.keras.elastic`
(`tfdist.horovod.elastic_state`): under an elastic `tfdist-run`
(`--min-np/--max-np`) a committed state is written for the processes of the
next size, which resume from it; `state.commit()` stops every rank at the
same commit when the job resizes.
"""

from tfdist.horovod.elastic_state import (HorovodInternalError, HostsUpdatedInterrupt,
                                          KerasState, State, run)

TensorFlowKerasState = KerasState


class TensorFlowState(State):
    """Horovod's `TensorFlowState(variables=None, **kwargs)`: `variables` (a list of
    `tf.Variable`s) and `kwargs` as attributes."""

    def __init__(self, variables=None, **kwargs):
        self.variables = list(variables or [])
        super().__init__(**kwargs)

    def _variables(self):
        return self.variables


__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "State", "TensorFlowKerasState",
           "TensorFlowState", "run"]
