"""The training state a backup holds beyond the weights file, and how a resume applies it.

Keras' `BackupAndRestore` saves the model's and the optimizer's variables
(`save_weights`) and the epoch; rerun, it restarts that epoch from its
first batch with the optimizer's step already past it, its trajectory
shifted (a plain Keras run stopped mid-epoch ends 0.1 from the run never
stopped: docs/fault-tolerance.md). Under a tfdist strategy every backup
also records, in the same small metadata file (written atomically with the
weights, `checkpoint_files.save_backup`), what the next step depends on:

* the position: the epoch, how many of its steps are trained, the
  optimizer's step count and the world size that wrote it;
* the random state `save_weights` leaves out: the layers' seed generators
  (Dropout, noise layers, random augmentation);
* the epoch's metric state so far (the loss and metrics' running sums), so
  the resumed epoch logs what the uninterrupted run logged;
* the state of the callbacks that steer training (`EarlyStopping`'s
  patience and best value, `ReduceLROnPlateau`'s, the checkpoint
  callbacks' batch counters), as JSON-able attributes;
* with the asynchronous parameter server, each server's optimizer step
  count (its slots are in the weights file: `async_client.fetch_state`).

Every rank holds the same values of all of these (a step makes metric and
seed state global, `local_state`), so the chief's copy is every rank's: on
resume the chief reads the file, `share` sends it to every rank (two
broadcasts), and each applies it. Arrays travel as nested lists of their
exact values (float32 and integers survive JSON's float64 unchanged).

Cost: the metadata file grows by the metric and seed state (tens of
numbers for a usual model); a resume adds two broadcasts.
"""

from typing import Any, Dict, List, Optional

import numpy as np
from absl import logging

FORMAT = 1
_JSON_SCALARS = (bool, int, float, str, type(None))


def _jsonable(value):
    """`value` as a JSON value if it is a scalar (NumPy's included), else None."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, _JSON_SCALARS):
        return value, True
    return None, False


def _array_entry(variable) -> Dict[str, Any]:
    value = np.asarray(variable.numpy() if hasattr(variable, "numpy") else variable)
    return {"dtype": value.dtype.name, "values": value.tolist()}


def _assign_entries(variables, entries, what):
    """Assign each entry to its variable; False (and nothing assigned) if they do not fit."""
    if len(entries) != len(variables):
        logging.warning("tfdist: the backup holds %d %s, the model %d: they start afresh.",
                        len(entries), what, len(variables))
        return False
    arrays = [np.asarray(entry["values"], dtype=entry["dtype"]) for entry in entries]
    if any(tuple(a.shape) != tuple(v.shape) for a, v in zip(arrays, variables)):
        logging.warning("tfdist: the backup's %s have other shapes than the model's: they start "
                        "afresh.", what)
        return False
    for variable, array in zip(variables, arrays):
        variable.assign(array)
    return True


def random_state_variables(model) -> List[Any]:
    """The model's seed-generator states: its variables that are not weights."""
    weights = {id(v) for v in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def callback_key(callback, callbacks) -> str:
    """`<class name>#<n>`: the n-th callback of its class in the list (stable across runs of
    one script)."""
    same = [c for c in callbacks if type(c) is type(callback)]
    return f"{type(callback).__name__}#{same.index(callback)}"


class TrainingState:
    """What a backup records beyond the weights (see the module docstring).

    Args:
        position: {"epoch": epoch in progress, "steps_done": its steps trained
            (0 at an epoch's start), "iterations": the optimizer's step
            count, "world_size": processes that wrote it}.
        random_state, metrics: the variables' values, as `_array_entry`s.
        callbacks: {`callback_key`: {attribute: JSON value}}.
        servers: the asynchronous parameter server's state ({"iterations": [one count per
            server]}), or None.
    """

    def __init__(self, position: Dict[str, int], random_state=(), metrics=(),
                 callbacks: Optional[Dict[str, Dict[str, Any]]] = None,
                 servers: Optional[Dict[str, Any]] = None):
        self.position = dict(position)
        self.random_state = list(random_state)
        self.metrics = list(metrics)
        self.callbacks = dict(callbacks or {})
        self.servers = servers

    # --------------------------------------------------------------- capture
    @classmethod
    def capture(cls, model, epoch: int, steps_done: int, world_size: int,
                callback_attributes: Dict[str, Dict[str, Any]],
                servers: Optional[Dict[str, Any]] = None) -> "TrainingState":
        """The state of `model` after `steps_done` steps of `epoch`; `callback_attributes`
        and the `servers`' state come from the caller (which knows the callbacks' private
        attributes and the strategy)."""
        optimizer = getattr(model, "optimizer", None)
        iterations = int(optimizer.iterations.numpy()) if optimizer is not None else 0
        return cls({"epoch": int(epoch), "steps_done": int(steps_done),
                    "iterations": iterations, "world_size": int(world_size)},
                   [_array_entry(v) for v in random_state_variables(model)],
                   [_array_entry(v) for v in model.metrics_variables],
                   callback_attributes, servers)

    @staticmethod
    def attributes_of(callback, names) -> Dict[str, Any]:
        """The JSON-able values of `callback`'s attributes `names` (others left out)."""
        found = {}
        for name in names:
            if hasattr(callback, name):
                value, ok = _jsonable(getattr(callback, name))
                if ok:
                    found[name] = value
        return found

    # ----------------------------------------------------------- serialising
    def to_json(self) -> Dict[str, Any]:
        return {"format": FORMAT, "position": self.position, "random_state": self.random_state,
                "metrics": self.metrics, "callbacks": self.callbacks, "servers": self.servers}

    @classmethod
    def from_json(cls, data: Optional[Dict[str, Any]]) -> Optional["TrainingState"]:
        """The state in a backup's metadata (None for a backup without one, e.g. plain Keras')."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None
        return cls(data["position"], data.get("random_state", ()), data.get("metrics", ()),
                   data.get("callbacks"), data.get("servers"))

    @classmethod
    def share(cls, communicator, state: Optional["TrainingState"]) -> Optional["TrainingState"]:
        """The chief's `state` (or None) on every rank: its JSON in two broadcasts."""
        return cls.from_json(communicator.broadcast_json(
            state.to_json() if state is not None else None))

    # ------------------------------------------------------------- applying
    def apply_random_state(self, model) -> None:
        """The layers' seed generators continue where the backup's run was."""
        _assign_entries(random_state_variables(model), self.random_state, "seed states")

    def apply_metrics(self, model) -> None:
        """The epoch's metric state so far (after the epoch's reset of the metrics)."""
        if self.position["steps_done"]:
            _assign_entries(model.metrics_variables, self.metrics, "metric states")

    def apply_callbacks(self, callbacks) -> None:
        """Each recorded callback's attributes, set on the same callback of this run's list."""
        for callback in callbacks:
            for name, value in self.callbacks.get(callback_key(callback, callbacks), {}).items():
                setattr(callback, name, value)
