"""Horovod's elastic state (`hvd.elastic.KerasState`) and `hvd.elastic.run`, on tfdist's restarts.

Horovod Elastic keeps its processes and resets them in place when the
workers change: `run(func)` catches a lost peer (`HorovodInternalError`:
roll back to the last `commit()`) or a host change (`HostsUpdatedInterrupt`,
raised by `commit()`), re-forms the ring, `sync()`s the state from rank 0
and calls `func(state)` again.

TensorFlow's collectives cannot re-form in a running process, so tfdist
does the same with new processes (`tfdist-run --min-np/--max-np`,
`tfdist.launch.elastic_job`):

- `commit()` keeps the state (the model's and optimizer's variables and
  the state's own attributes, e.g. `epoch`, `batch`) in memory, as
  Horovod's does; under an elastic tfdist-run the chief also writes it to
  the job's channel directory (`elastic_channel`), which lives as long as
  the job: the in-memory state of the job, kept across its processes.
  Then it checks for a host change: the launcher's resize request, agreed
  by every rank at the same training step (the preemption flag of the
  step's all-reduce, the same path as a preemption notice), raises
  `HostsUpdatedInterrupt` on every rank at the same commit.
- `run(func)` arms that check for `func`'s duration; a
  `HostsUpdatedInterrupt` ends the process with exit code 42 (the state is
  committed), a lost peer ends the job (tfdist-run stops the others); the
  launcher starts the processes at the new size, and `run` there restores
  the last committed state, `sync()`s it from rank 0 and calls `func(state)`
  - as Horovod's reset does, with the script's start (`hvd.init()`, the
  model, the learning rate from `hvd.size()`) run anew by the new process
  in place of the reset callbacks, which tfdist does not call (no process
  is reset in place).

Horovod's semantics, not tfdist's exactness: each rank's data and batch are
its own, so the global batch changes with the size, and a lost peer rolls
back to the last commit (steps after it are trained again).

Cost: a commit copies the variables to host memory (every rank) and, under
an elastic tfdist-run, the chief writes them (one small `.npz` per commit:
commit less often with `CommitStateCallback(batches_per_commit=N)`).
"""

import json
import os
import sys

import numpy as np

from tfdist.fault_tolerance import elastic_channel
from tfdist.fault_tolerance.checkpoint_files import write_atomically
from tfdist.fault_tolerance.restarts import PREEMPTED_EXIT_CODE
from tfdist.horovod import collectives, process

STATE_FILE = "horovod_state.npz"
_in_run = [False]  # inside a function `run` wraps


class HostsUpdatedInterrupt(RuntimeError):
    """The job's processes change: every rank stops at this commit (Horovod's name)."""

    def __init__(self, skip_sync=False):
        super().__init__("the job's hosts changed: every rank stops at this commit")
        self.skip_sync = skip_sync


class HorovodInternalError(RuntimeError):
    """Horovod's name for a failed collective (a lost peer); tfdist ends the job instead and
    tfdist-run restarts it from the last commit."""


class State:
    """Horovod's `State`: `commit`, `restore`, `sync`, `save`, `check_host_updates` and reset
    callbacks, over named attributes (`kwargs`) and the variables `_variables()` lists."""

    def __init__(self, **kwargs):
        self._attributes = dict(kwargs)
        self._reset_callbacks = []
        self._saved = None
        for name, value in kwargs.items():
            setattr(self, name, value)

    # ------------------------------------------------------------ Horovod's interface
    def register_reset_callbacks(self, callbacks):
        """Kept for Horovod's scripts: tfdist resets no process in place (a new process runs
        the script's start instead), so they are not called."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Keep the state (and, under an elastic tfdist-run, write it for the next processes);
        then stop here if the job's processes change."""
        self.save()
        self.check_host_updates()

    def save(self):
        self._saved = (self._values(), self._current_attributes())
        channel = elastic_channel.directory()
        if channel and process.rank() == 0:
            _write_state(os.path.join(channel, STATE_FILE), *self._saved)
            elastic_channel.record_backup({"committed": self._saved[1],
                                           "world_size": process.size()})

    def restore(self):
        """Back to the last commit."""
        if self._saved is not None:
            self._apply(*self._saved)

    def sync(self):
        """Rank 0's state on every rank."""
        if process.size() > 1:
            collectives.broadcast_variables(self._variables(), root_rank=0)
            communicator = process.strategy().extended.communicator
            for name, value in communicator.broadcast_json(self._current_attributes()).items():
                setattr(self, name, value)

    def check_host_updates(self):
        """Every rank raises `HostsUpdatedInterrupt` at the same commit once the launcher's
        resize request (or a preemption notice) was agreed at a training step."""
        notice = process.strategy().extended.preemption
        if notice.armed and notice.agreed():
            if process.size() > 1:
                process.strategy().extended.barrier("at the commit before the resize")
            notice.taken()
            raise HostsUpdatedInterrupt()

    # ------------------------------------------------------------------- internals
    def _variables(self):
        return []

    def _values(self):
        return [np.array(v.numpy()) for v in self._variables()]

    def _current_attributes(self):
        return {name: getattr(self, name) for name in self._attributes}

    def _apply(self, values, attributes):
        variables = self._variables()
        if len(values) != len(variables):
            raise ValueError(f"tfdist.horovod: the committed state holds {len(values)} "
                             f"variables, this model and optimizer {len(variables)}: the "
                             "script built another model since the commit")
        for variable, value in zip(variables, values):
            variable.assign(value)
        for name, value in attributes.items():
            setattr(self, name, value)

    def _restore_from_the_job(self):
        """In a process tfdist-run started again: the state the job committed last."""
        channel = elastic_channel.directory()
        path = os.path.join(channel, STATE_FILE) if channel else None
        if path is None or not os.path.exists(path):
            return False
        self._saved = _read_state(path)
        self._apply(*self._saved)
        return True


class KerasState(State):
    """Horovod's `hvd.elastic.KerasState(model, optimizer=None, **kwargs)`: the model's and
    the optimizer's variables, and `kwargs` as attributes (`state.epoch`, `state.batch`)."""

    def __init__(self, model, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        super().__init__(**kwargs)

    def _variables(self):
        optimizer_variables = list(self.optimizer.variables) if self.optimizer is not None \
            else []
        return list(self.model.variables) + optimizer_variables


def arm_if_running():
    """A `fit` inside `run` starts (`CommitStateCallback.on_train_begin`): its steps carry the
    launcher's resize request (each `fit` disarms the notice when it ends)."""
    if not _in_run[0]:
        return
    notice = process.strategy().extended.preemption
    if not notice.armed:
        notice.arm()


def run(func):
    """Horovod's `@hvd.elastic.run`: call `func(state, ...)`; in a process an elastic
    tfdist-run started again, first restore the job's last committed state; a host change
    at a commit ends the process with exit code 42 (the launcher restarts the job at its new
    size)."""

    def wrapper(state, *args, **kwargs):
        notice = process.strategy().extended.preemption
        restored = state._restore_from_the_job()  # pylint: disable=protected-access
        state.sync()
        if restored and process.rank() == 0:
            committed = state._current_attributes()  # pylint: disable=protected-access
            print(f"tfdist.horovod: resumed from the job's last commit at {committed} on "
                  f"{process.size()} process(es)", flush=True)
        notice.arm()
        _in_run[0] = True
        try:
            return func(state, *args, **kwargs)
        except HostsUpdatedInterrupt:
            if process.rank() == 0:
                print("tfdist.horovod: the job's processes change: the state is committed; "
                      f"every rank exits with code {PREEMPTED_EXIT_CODE} and tfdist-run "
                      "starts the job at its new size", flush=True)
            sys.stdout.flush()
            raise SystemExit(PREEMPTED_EXIT_CODE) from None
        finally:
            _in_run[0] = False
            if notice.armed:
                notice.disarm()

    wrapper.__wrapped__ = func
    wrapper.__name__ = getattr(func, "__name__", "wrapper")
    wrapper.__doc__ = func.__doc__
    return wrapper


def _write_state(path, values, attributes):
    write_atomically(lambda temporary: np.savez(
        temporary, attributes=np.array(json.dumps(attributes)),
        **{f"v{i}": value for i, value in enumerate(values)}), path)


def _read_state(path):
    with np.load(path) as data:
        attributes = json.loads(str(data["attributes"]))
        count = len([k for k in data.files if k.startswith("v")])
        values = [data[f"v{i}"] for i in range(count)]
    return values, attributes
