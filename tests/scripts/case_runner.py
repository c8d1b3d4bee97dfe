"""The shared frame of the case scripts (keras_patterns.py, real_world.py).

A case script defines `case_<name>(strategy)` functions, each returning a dict
of arrays (weights, history, evaluation, predictions); `run_cases` runs the
chosen ones under one strategy and saves them as `<out>.rank<R>.npz`, one key
per `<case>/<array>`, for the test to compare across ranks and with the
reference run.
"""

import numpy as np
import tensorflow as tf

STRATEGIES = ["plain", "ring", "sharded", "tree", "ps"]


def cases_of(namespace):
    """The `case_<name>` functions of a module's namespace, by name."""
    return {name[len("case_"):]: fn for name, fn in namespace.items() if name.startswith("case_")}


def make_strategy(kind, backend="auto"):
    """The strategy a case script trains under: `plain` is no tfdist at all (the default
    `tf.distribute` strategy); `ring`, `sharded` (the ring, optimizer state sharded),
    `tree` (fanout 2) and `ps` are tfdist's."""
    if kind == "plain":
        return tf.distribute.get_strategy()
    import tfdist  # pylint: disable=import-outside-toplevel

    if kind == "ring":
        return tfdist.strategies.RingAllReduceStrategy(backend=backend)
    if kind == "sharded":  # the ring with the optimizer state sharded (ZeRO stage 1)
        return tfdist.strategies.RingAllReduceStrategy(backend=backend,
                                                       shard_optimizer_state=True)
    if kind == "tree":
        return tfdist.strategies.ReductionTreeStrategy(fanout=2)
    return tfdist.strategies.ParameterServerStrategy()


def rank_of(strategy):
    return getattr(strategy, "rank", 0)


def results(model, history=None, evaluation=None, predictions=None, **extra):
    """The arrays a test compares: weights, history, evaluation, predictions, extras."""
    out = {f"w{i}": np.asarray(w) for i, w in enumerate(model.get_weights())}
    if history is not None:
        out.update({f"h_{k}": np.asarray(v) for k, v in history.history.items()})
    if evaluation is not None:
        out.update({f"e_{k}": np.asarray(v) for k, v in evaluation.items()})
    if predictions is not None:
        out["predictions"] = np.asarray(predictions)
    out.update({k: np.asarray(v) for k, v in extra.items()})
    return out


def run_cases(cases, names, strategy, out):
    """Run `cases[name](strategy)` for each of `names` in order; save `<out>.rank<R>.npz`."""
    arrays = {}
    for name in names:
        arrays.update({f"{name}/{key}": value for key, value in cases[name](strategy).items()})
        if rank_of(strategy) == 0:
            print("case", name, "done", flush=True)
    np.savez(f"{out}.rank{rank_of(strategy)}.npz", **arrays)
