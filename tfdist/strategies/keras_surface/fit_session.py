"""The state of a running `fit` / `evaluate` / `predict`: one owner, `LoopCall`.

What the hooks of one running loop share lives in one object per call,
made when a model under a tfdist strategy enters `fit`, `evaluate` or
`predict` (`data`'s call recording: `running`) and dropped when the call
returns or raises, on the thread that runs it (simulated ranks are threads:
each sees its own calls). A `fit`'s validation `evaluate` is a call inside
it (`calls()` is the thread's stack, innermost last).

A `LoopCall` holds:

* `signature`: the arguments every rank must pass alike
  (`call_arguments.call_signature`), compared when its epoch iterator is
  built;
* `fit_iterator`: a `fit`'s training epoch iterator (the one a resume
  replays, and the one the optimizer is built for before the first step);
* `replay_to`: where that iterator resumes (epoch, steps done, the training
  state, the model), consumed by its first epoch (`backup`);
* `resume_state`: the `TrainingState` this `fit` resumes from, applied to
  the callbacks after every `on_train_begin` (`backup`);
* `epoch_without_steps`: a resumed epoch whose steps were all trained
  before the backup (its logs come from the restored metrics).

Besides, per thread and for any model (tfdist's learning-rate callbacks
work without a tfdist strategy too), the data adapter of the latest epoch
iterator built (`latest_data_adapter`: the global batch size).

Before this module the same state sat in attributes stashed on Keras
objects, two thread-locals, two weak dictionaries and a process global
that simulated ranks shared. Cost: a list push and pop per call.
"""

import contextlib
import threading
import weakref
from typing import Any, Iterator, List, Optional

_local = threading.local()


class LoopCall:
    """One running `fit`, `evaluate` or `predict` of a model under a tfdist strategy."""

    def __init__(self, model: Any, name: str, signature: Any):
        self.model = model
        self.name = name  # "fit", "evaluate" or "predict"
        self.signature = signature
        self.fit_iterator: Any = None
        self.replay_to: Optional[tuple] = None
        self.resume_state: Any = None
        self.epoch_without_steps: Optional[int] = None


def calls() -> List[LoopCall]:
    """This thread's running calls, innermost last."""
    stack = getattr(_local, "calls", None)
    if stack is None:
        stack = _local.calls = []
    return stack


@contextlib.contextmanager
def running(model: Any, name: str, signature: Any) -> Iterator[LoopCall]:
    """`model.<name>(...)` runs inside: its `LoopCall` is the thread's innermost."""
    call = LoopCall(model, name, signature)
    stack = calls()
    stack.append(call)
    try:
        yield call
    finally:
        stack.remove(call)


def current() -> Optional[LoopCall]:
    """The innermost running call of this thread, or None."""
    stack = calls()
    return stack[-1] if stack else None


def current_fit(model: Any = None) -> Optional[LoopCall]:
    """The innermost running `fit` of this thread (of `model`, when given), or None."""
    for call in reversed(calls()):
        if call.name == "fit" and (model is None or call.model is model):
            return call
    return None


def is_fit_iterator(epoch_iterator: Any) -> bool:
    """Whether `epoch_iterator` is the training iterator of this thread's innermost fit."""
    call = current_fit()
    return call is not None and call.fit_iterator is epoch_iterator


def record_data_adapter(adapter: Any) -> None:
    """The data adapter of the epoch iterator just built on this thread."""
    _local.latest_adapter = weakref.ref(adapter)


def latest_data_adapter() -> Any:
    """The data adapter of the latest epoch iterator built on this thread, or None."""
    reference = getattr(_local, "latest_adapter", None)
    return reference() if reference is not None else None
