"""One Keras optimizer whose state is sharded across the ranks (`modes.ShardedOptimizerState`).

The algorithm is `tfdist.strategies.modes.optimizer_shards`; this module puts it
into one Keras optimizer object when the sharded mode's `begin_build` asks, as
Keras builds it, through attributes of that one object
(`patch_points.replace_on_instance`), so the optimizer keeps its class, config
and saved form:

* `add_variable_from_reference`: a slot of a model variable gets the shape of this
  rank's slice of it (created as the rank's own, never broadcast);
* `_all_reduce_sum_gradients` (TensorFlow's update path, after weight decay): each
  (gradient slice, model variable) pair becomes (gradient slice, shard variable),
  which takes the variable's decayed slice first; pairs of variables this rank owns
  nothing of drop out;
* `_clip_gradients`: `clipnorm` and `global_clipnorm` with the whole gradients'
  norms (summed over the ranks); `clipvalue` is element-wise;
* `_update_model_variables_moving_average`, `_overwrite_model_variables_with_average_value`:
  EMA on the shard variables; `finalize_variable_values` gathers them back;
* `save_own_variables` / `load_own_variables`: the whole slots (consolidated by
  `consolidated(model)` on every rank that saves) in the plain optimizer's order, so
  the file is Keras' own; a load takes this rank's slices of the whole slots.

* a LossScaleOptimizer's `check_finite`, around an optimizer whose gradients are
  reduce-scattered (`scatter_target`): the verdict of every rank's slices.

`apply_sharded` is the apply: the global gradients cut to this rank's slices (or
the slices a reduce-scatter gave), Keras' own `apply` on them, the parameters
gathered, constraints applied.
"""

import functools

import keras
import tensorflow as tf

from tfdist.profiling.names import communication_scope

from tfdist.strategies.keras_surface import patch_points
from tfdist.strategies.keras_surface.keras_internals import BaseOptimizer, LossScaleOptimizer
from tfdist.strategies.modes import parameter_shards
from tfdist.strategies.modes.optimizer_shards import shards_of

# Keras' optimizers whose update of an element reads only that element (and scalars).
ELEMENT_WISE = ("SGD", "Adam", "AdamW", "Adamax", "Nadam", "RMSprop", "Adagrad", "Adadelta",
                "Ftrl", "Lion")


def _update_rule_owner(optimizer):
    """The class whose `update_step` `optimizer` runs."""
    return next(cls for cls in type(optimizer).__mro__ if "update_step" in vars(cls))


def check_shardable(optimizer, variables, rank):
    """A clear error unless `optimizer`'s update of an element reads only that element."""
    owner = _update_rule_owner(optimizer)
    known = {name: getattr(keras.optimizers, name, None) for name in ELEMENT_WISE}
    if owner not in known.values():
        raise ValueError(
            f"tfdist rank {rank}: shard_optimizer_state=True updates each rank's slice of "
            "every variable on its own, which equals the whole update only for an element-wise "
            f"rule ({', '.join(ELEMENT_WISE)}, or a LossScaleOptimizer around one); "
            f"{type(optimizer).__name__}'s update_step ({owner.__module__}.{owner.__name__}) "
            "is not one of them. Use one of those, or shard_optimizer_state=False.")
    direct = [getattr(v, "path", v.name) for v in variables
              if getattr(v, "overwrite_with_gradient", False)]
    if direct:
        raise ValueError(
            f"tfdist rank {rank}: shard_optimizer_state=True cannot shard variables that take "
            f"their gradient as their value (overwrite_with_gradient: {direct}, float8 "
            "training); use shard_optimizer_state=False.")


def scatter_target(optimizer):
    """The `OptimizerShards` whose gradients `optimizer`'s apply takes reduce-scattered (its
    own, or its inner optimizer's for a LossScaleOptimizer), or None."""
    shards = shards_of(optimizer)
    if shards is None and isinstance(optimizer, LossScaleOptimizer):
        shards = shards_of(optimizer.inner_optimizer)
    return shards if shards is not None and shards.scatters else None


def end_build(optimizer):
    """After Keras built `optimizer`: its update steps find their slots by shard variable;
    a LossScaleOptimizer around one whose gradients are scattered checks them all."""
    if isinstance(optimizer, LossScaleOptimizer):
        inner = scatter_target(optimizer)
        if inner is not None:
            _check_finite_over_ranks(optimizer, inner)
        return
    shards = shards_of(optimizer)
    if shards is None:
        return
    indices = optimizer._trainable_variables_indices  # pylint: disable=protected-access
    for i, shard in enumerate(shards.shard_variables):
        indices[optimizer._var_key(shard)] = i  # pylint: disable=protected-access


def apply_sharded(optimizer, original_apply, grads, trainable_variables):
    """Keras' `apply` of `optimizer` on this rank's slices of the global `grads`, then the
    parameters gathered from every rank and the variables' constraints applied."""
    shards = shards_of(optimizer)
    variables = list(trainable_variables if trainable_variables is not None
                     else optimizer._trainable_variables)  # pylint: disable=protected-access
    indices = [shards.index_of(v) for v in variables]
    if any(i is None for i in indices):
        unknown = [getattr(v, "path", v.name) for v, i in zip(variables, indices) if i is None]
        raise ValueError(f"tfdist: unknown variables for {optimizer.name}: {unknown}")
    grads = list(grads)
    slices = [None if g is None else shards.local_part(g, i) for g, i in zip(grads, indices)]
    shards.copy_in()
    result = original_apply(optimizer, slices, variables)
    applied = [i for g, i in zip(grads, indices) if g is not None]
    shards.keep_all(grads)  # every gradient's sum stays in every rank's step
    shards.gather_into_model()
    for i in applied:
        variable = shards.variables[i]
        if getattr(variable, "constraint", None) is not None:
            variable.assign(variable.constraint(variable))
    return result


def _check_finite_over_ranks(optimizer, shards):
    """The LossScaleOptimizer's finite check of reduce-scattered gradients over every rank.

    Each rank holds its slices of the global gradients only; a rank seeing no inf or
    NaN in its slices would apply the update another rank skips (and halve its loss
    scale differently). The ranks' counts of non-finite slices are all-reduced: one
    scalar collective per step.
    """
    check_finite = type(optimizer).check_finite

    def check_finite_over_ranks(grads):
        local = check_finite(optimizer, grads)
        with tf.name_scope(communication_scope("sharded", "finite_check")):
            bad = shards.communicator.all_reduce(
                tf.reshape(1.0 - tf.cast(local, tf.float32), [1]))
        return tf.equal(bad[0], 0.0)

    patch_points.replace_on_instance(optimizer, "LossScaleOptimizer", "check_finite",
                                     functools.wraps(check_finite)(check_finite_over_ranks))


def install_on(optimizer, shards, rank_local_variables):
    """The per-object overrides of the module docstring, on `optimizer` (sharded as `shards`;
    `rank_local_variables`: the scope in which a slot takes this rank's own initial value)."""
    cls = type(optimizer)

    def add_variable_from_reference(reference_variable, name=None, initializer="zeros"):
        shape = shards.slot_shape(reference_variable)
        if shape is None:
            return cls.add_variable_from_reference(optimizer, reference_variable, name=name,
                                                   initializer=initializer)
        with rank_local_variables(), \
                shards.slots.creating(reference_variable) as created:
            slot = BaseOptimizer.add_variable_from_reference(
                optimizer, _SliceReference(reference_variable, shape), name=name,
                initializer=initializer)
        shards.slots.remember(slot, reference_variable, created)
        return slot

    def _all_reduce_sum_gradients(grads_and_vars):
        pairs = []
        for grad, variable in grads_and_vars:
            index = shards.index_of(variable)
            if index is None or not shards.local_size(index):
                continue
            shards.copy_in([index])  # after weight decay changed the whole variable
            pairs.append((grad, shards.shard_variables[index]))
        return pairs

    def _clip_gradients(grads):
        if not (optimizer.clipnorm and optimizer.clipnorm > 0) and not (
                optimizer.global_clipnorm and optimizer.global_clipnorm > 0):
            return cls._clip_gradients(optimizer, grads)
        squares = shards.summed_squares(grads)
        if optimizer.clipnorm and optimizer.clipnorm > 0:
            return [None if g is None else _clip_by_norm(g, squares[j], optimizer.clipnorm)
                    for j, g in enumerate(grads)]
        present = [j for j, g in enumerate(grads) if g is not None]
        use_norm = tf.sqrt(tf.reduce_sum(tf.gather(squares, present)))
        clip = tf.cast(optimizer.global_clipnorm, use_norm.dtype)
        scale = clip * tf.minimum(1.0 / use_norm, 1.0 / clip) + (use_norm - use_norm)
        return [None if g is None else g * tf.cast(scale, g.dtype) for g in grads]

    def _on_shards(variables):
        return [shards.shard_variables[shards.index_of(v)] for v in variables]

    def _update_model_variables_moving_average(trainable_variables):
        return cls._update_model_variables_moving_average(optimizer,
                                                          _on_shards(trainable_variables))

    def _overwrite_model_variables_with_average_value(trainable_variables):
        return cls._overwrite_model_variables_with_average_value(optimizer,
                                                                 _on_shards(trainable_variables))

    def finalize_variable_values(var_list):
        cls.finalize_variable_values(optimizer, var_list)
        if optimizer.use_ema:
            shards.gather_into_model()

    def save_own_variables(store):
        for i, variable in enumerate(optimizer.variables):
            if shards.slots.holds(variable):
                whole = shards.slots.whole_value(variable)
                if whole is None:
                    raise RuntimeError(
                        f"tfdist rank {shards.rank}: {optimizer.name}'s state is sharded "
                        "across the ranks (shard_optimizer_state=True) and was not gathered "
                        "for this save; save with model.save / save_weights / ModelCheckpoint "
                        "on every rank.")
                store[str(i)] = whole
            else:
                store[str(i)] = variable.numpy()

    def load_own_variables(store):
        variables = optimizer.variables
        if len(store.keys()) != len(variables):
            return cls.load_own_variables(optimizer, store)  # Keras' warning, nothing loaded
        for i, variable in enumerate(variables):
            if shards.slots.holds(variable):
                shards.slots.load_whole(variable, store[str(i)])
            else:
                variable.assign(store[str(i)])

    if shards.holds_parameters:  # stage 3: the update reads and writes the stored slices
        _install_raw_update(optimizer, cls)

    overrides = {
        "add_variable_from_reference": add_variable_from_reference,
        "_clip_gradients": _clip_gradients,
        "_update_model_variables_moving_average": _update_model_variables_moving_average,
        "_overwrite_model_variables_with_average_value":
            _overwrite_model_variables_with_average_value,
        "finalize_variable_values": finalize_variable_values,
        "save_own_variables": save_own_variables,
        "load_own_variables": load_own_variables,
    }
    for name, replacement in overrides.items():
        patch_points.replace_on_instance(optimizer, "BaseOptimizer", name,
                                         functools.wraps(getattr(cls, name))(replacement))
    patch_points.replace_on_instance(optimizer, "TFOptimizer", "_all_reduce_sum_gradients",
                                     _all_reduce_sum_gradients)


def _install_raw_update(optimizer, cls):
    """Stage 3: the update (clipping, weight decay, the rule, EMA) reads the parameters'
    stored slices, not their gathered whole values (`parameter_shards.raw_reads`)."""
    for name in ("_backend_apply_gradients", "_overwrite_model_variables_with_average_value"):
        method = getattr(cls, name)

        def raw(*args, _method=method, **kwargs):
            with parameter_shards.raw_reads():
                return _method(optimizer, *args, **kwargs)

        patch_points.replace_on_instance(optimizer, "BaseOptimizer", name,
                                         functools.wraps(method)(raw))


def _clip_by_norm(values, l2sum, clipnorm):
    """Keras' `_clip_by_norm` with the whole gradient's squared norm `l2sum` (a sparse
    gradient stays sparse, as Keras' does: its occurrences scaled)."""
    l2sum = tf.cast(l2sum, values.dtype)
    pred = l2sum > 0
    l2sum_safe = tf.where(pred, l2sum, tf.ones_like(l2sum))
    l2norm = tf.where(pred, tf.sqrt(l2sum_safe), l2sum)
    clip = tf.cast(clipnorm, values.dtype)
    if isinstance(values, tf.IndexedSlices):
        return tf.IndexedSlices(values.values * clip / tf.maximum(l2norm, clip),
                                values.indices, values.dense_shape)
    return values * clip / tf.maximum(l2norm, clip)


class _SliceReference:
    """A model variable as `add_variable_from_reference` reads it, with this rank's slice's
    shape: the slot keeps the variable's name, dtype and placement."""

    def __init__(self, variable, shape):
        self.shape = tuple(shape)
        self.dtype = variable.dtype
        self.name = variable.name
        if hasattr(variable, "path"):
            self.path = variable.path
        self._layout = None
