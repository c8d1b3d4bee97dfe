"""The fit/evaluate/predict loop's stop flags, agreed by every rank.

A callback may stop training on one rank only (its own clock, a local file,
a rank-dependent condition); the others would then wait for it in the next
step. So in a multi-process job the flags Keras' loops read
(`stop_training`, `stop_evaluating`, `stop_predicting`) are agreed: right
after the callback list has run a hook after which the loop may read the
flag, the flag becomes true on every rank if it is true on any, and is
written back as the model's plain attribute, which the loop then reads.
The callback list of a tfdist model calls these functions after its hooks
(`callback_list`).

Where the agreements happen (the *schedule*), decided once per loop:

* only callbacks that might decide alone count: Keras' own and tfdist's
  set no flag or set it from the global logs (`agrees_across_ranks`), so
  with only those every rank decides the same and nothing is exchanged;
* with one that might decide alone, the flag is agreed after each
  `on_epoch_begin` and `on_epoch_end` (fit) or after `on_test_begin` /
  `on_predict_begin`; and after every batch only if such a callback
  implements a batch hook of that loop (only then can the flag change
  between batches).

The schedule is itself agreed at the loop's start (`on_train_begin`,
`on_test_begin`, `on_predict_begin`: one tiny all-reduce), so ranks whose
callback lists differ (a logger added on the chief only) still exchange at
the same points.

Cost in a multi-process job: one tiny all-reduce (the schedule) per fit,
per validation pass and per evaluate/predict; then none per batch unless a
callback that may decide alone has batch hooks (one all-reduce and a host
sync per batch), plus one at the start of training and two per epoch when
such a callback exists.
"""


from tfdist.strategies.keras_surface.model_strategy import agrees, tfdist_strategy

EDGES, BATCHES = 0, 1  # where an agreement may be scheduled: the loop's and epochs' edges, batches

_FLAGS = {"train": "stop_training", "test": "stop_evaluating", "predict": "stop_predicting"}
_BATCH_HOOKS = {
    "train": ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end"),
    "test": ("on_test_batch_begin", "on_test_batch_end"),
    "predict": ("on_predict_batch_begin", "on_predict_batch_end"),
}


def _implements(callback, hook):
    """True unless `hook` is `Callback`'s default (Keras marks those `_is_default`); a hook set
    on the instance counts (`LambdaCallback`), as Keras' own dispatch decides."""
    return not getattr(getattr(callback, hook, None), "_is_default", False)


def local_schedule(callback_list, mode):
    """(agree at the loop's and epochs' edges, agree after every batch) for this rank's list."""
    alone = [callback for callback in callback_list.callbacks if not agrees(callback)]
    return (bool(alone), any(_implements(callback, hook) for callback in alone
                             for hook in _BATCH_HOOKS[mode]))


def _strategy_of(callback_list):
    strategy = tfdist_strategy(getattr(callback_list, "model", None))
    if strategy is None or strategy.world_size == 1:
        return None
    return strategy


def agree_schedule(callback_list, mode):
    """At a loop's start: where this loop agrees its flag, the same on every rank."""
    strategy = _strategy_of(callback_list)
    schedule = (False, False)
    if strategy is not None:
        schedule = tuple(strategy.extended.any_rank_each(local_schedule(callback_list, mode)))
    callback_list.__dict__.setdefault("_tfdist_flag_schedule", {})[mode] = schedule
    return schedule


def agree_flag(callback_list, mode, point):
    """Agree the loop's flag after a hook, if the schedule says so at `point` (EDGES,
    BATCHES)."""
    schedule = callback_list.__dict__.get("_tfdist_flag_schedule", {}).get(mode)
    strategy = _strategy_of(callback_list)
    if schedule is None or strategy is None or not schedule[point]:
        return
    model, name = callback_list.model, _FLAGS[mode]
    setattr(model, name, strategy.extended.any_rank(bool(getattr(model, name, False)),
                                                    training=mode == "train"))
