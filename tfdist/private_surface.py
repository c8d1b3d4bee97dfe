"""Every private attribute of TensorFlow, Keras, Horovod or Python tfdist reads or writes, and why.

The Keras attributes tfdist *replaces* are declared in
`strategies/keras_surface/patch_points.py` (`POINTS`, `OVERRIDES`) and the
TensorFlow attributes it replaces in `TF_REPLACEMENTS` below (applied
through `tfdist._tf.replace`). What remains is reading or setting a private
attribute of an object tfdist does not define - `obj._name` or
`getattr(obj, "_name")` - where the library offers no public way. Each such
name is declared here with its owner, whether tfdist reads or writes it, and
why; the next Keras or TensorFlow can break exactly these, and
`compat.check_keras` verifies the Keras ones at import.
`tests/test_structure.py` fails on a private attribute used but not
declared, and on a TensorFlow attribute replaced outside `TF_REPLACEMENTS`.

This module is data only: it imports nothing.
"""

from typing import Dict, NamedTuple, Tuple


class PrivateUse(NamedTuple):
    """One private attribute: its owner, "read" / "write" / "read, write", and why."""

    owner: str
    access: str
    why: str


PRIVATE_ATTRIBUTES: Dict[str, PrivateUse] = {
    # --- Keras: the trainer, its epoch iterator and data adapters
    "_distribute_strategy": PrivateUse(
        "keras.Model", "read", "the strategy a model was built under (Keras' own record; "
        "`model.distribute_strategy` falls back to the default strategy)"),
    "_symbolic_build": PrivateUse(
        "Trainer", "read", "the symbolic build called with the dataset's spec instead of a "
        "peeked batch (`keras_patches.data`)"),
    "_maybe_symbolic_build": PrivateUse(
        "Trainer", "read", "replaced at a declared point (`patch_points`); read for its original"),
    "_make_function": PrivateUse("Trainer", "read", "checked by `compat` (steps run by `run`)"),
    "_distributed_dataset": PrivateUse(
        "TFEpochIterator", "read", "the dataset whose spec builds the model without peeking"),
    "_enumerate_iterator": PrivateUse(
        "TFEpochIterator", "read", "replaced at a declared point (a resume's replay); read for "
        "its original"),
    "_num_batches": PrivateUse(
        "TFEpochIterator", "read", "whether an input carries over epochs (a resume's replay)"),
    "_get_iterator": PrivateUse("TFEpochIterator", "read", "checked by `compat`"),
    "_inputs": PrivateUse(
        "ArrayDataAdapter, tf.data.Dataset", "read", "the arrays fit was given (their "
        "fingerprint across ranks); a dataset's inputs (whether it derives from a rank's slice)"),
    "_input_dataset": PrivateUse(
        "tf.data.Dataset", "read", "the generator pipeline under Keras' prefetch (ranks must "
        "take exactly the batches asked for)"),
    "_compile_loss": PrivateUse("Trainer", "read", "the compiled loss' trackers (metrics)"),
    "_value": PrivateUse("keras.metrics.Mean, keras.Variable", "read",
                         "its accumulated value (share-weighting); a Keras variable's "
                         "TensorFlow variable (sharding='parameters': the stored range)"),
    "_dense_var_to_tensor": PrivateUse(
        "tf.Variable (ResourceVariable)", "read, override",
        "the conversion of a variable to a tensor; a sharded parameter's storage class "
        "(modes/parameter_shards) converts to the gathered whole value"),
    "_serialize_to_tensors": PrivateUse(
        "tf.Variable (Trackable)", "read, override",
        "a checkpoint entry: a sharded parameter's or slot's storage writes its whole value"),
    "_restore_from_tensors": PrivateUse(
        "tf.Variable (Trackable)", "read, override",
        "a checkpoint restore: a sharded parameter's or slot's storage keeps its range"),
    # --- Keras: optimizers
    "_trainable_variables": PrivateUse(
        "BaseOptimizer", "read", "the variables `apply` updates when none are given"),
    "_trainable_variables_indices": PrivateUse(
        "BaseOptimizer", "read, write", "a sharded optimizer's update steps find their slots "
        "by shard variable"),
    "_var_key": PrivateUse("BaseOptimizer", "read", "the key of a variable's slots"),
    "_get_variable_index": PrivateUse("BaseOptimizer", "read", "LARS' slots by variable"),
    "_learning_rate": PrivateUse(
        "BaseOptimizer", "read", "the learning-rate variable or schedule itself (the "
        "parameter servers apply it; the rate callbacks set it)"),
    "_distribution_strategy": PrivateUse(
        "TFOptimizer", "read", "the strategy an optimizer was created under (Horovod's "
        "DistributedOptimizer options)"),
    # --- Keras: callbacks
    "_is_default": PrivateUse("keras.callbacks.Callback", "read",
                              "which hooks a callback defines (Keras marks its defaults)"),
    "_weights_path": PrivateUse("BackupAndRestore", "read", "where the backup's weights are"),
    "_training_metadata_path": PrivateUse("BackupAndRestore", "read", "the backup's metadata"),
    "_prev_weights_path": PrivateUse("BackupAndRestore", "read", "the previous backup"),
    "_prev_training_metadata_path": PrivateUse("BackupAndRestore", "read", "the previous "
                                               "backup's metadata"),
    "_last_batch_seen": PrivateUse(
        "BackupAndRestore, ModelCheckpoint", "read, write", "the position a backup records "
        "and a resume restores"),
    "_batches_seen_since_last_saving": PrivateUse(
        "BackupAndRestore, ModelCheckpoint", "read, write", "when they save next (a resume "
        "restores it)"),
    "_current_epoch": PrivateUse("BackupAndRestore, ModelCheckpoint", "read, write",
                                 "the epoch they count in (a resume restores it)"),
    "_initial_epoch": PrivateUse(
        "keras.Model", "read, write", "the epoch BackupAndRestore's restore makes fit start "
        "from: shared by every rank, set at a resume"),
    "_should_trace": PrivateUse(
        "keras.callbacks.TensorBoard", "read, write", "its profile_batch: each rank profiles "
        "into its own run instead"),
    "_start_batch": PrivateUse("keras.callbacks.TensorBoard", "read", "profile_batch's start"),
    "_stop_batch": PrivateUse("keras.callbacks.TensorBoard", "read", "profile_batch's end"),
    "_train_writer": PrivateUse("keras.callbacks.TensorBoard", "read",
                                "the run tfdist's scalars join"),
    "_init_profile_batch": PrivateUse("keras.callbacks.TensorBoard", "read",
                                      "checked by `compat`"),
    # --- attributes tfdist adds to objects of Keras or TensorFlow
    "_tfdist_state": PrivateUse(
        "BackupAndRestore", "write", "the callback's `BackupState` (one per callback object)"),
    "_tfdist_profile_batches": PrivateUse(
        "keras.callbacks.TensorBoard", "write", "the profile_batch each rank profiles"),
    "_tfdist_tracker": PrivateUse(
        "tf.Variable", "write", "the `LocalStateSync` a variable reports its assignments to"),
    "_tfdist_keras_class": PrivateUse(
        "adopted Keras classes", "write", "the class an object had before `adopt`"),
    # --- TensorFlow
    "_container_strategy": PrivateUse(
        "tf.distribute.StrategyExtendedV2", "read", "the strategy an extended object belongs "
        "to (TensorFlow's own accessor, for subclasses)"),
    "_device": PrivateUse("OneDeviceExtended", "read", "the process's device"),
    "_variant_tensor": PrivateUse(
        "tf.data.Dataset", "read", "a rank's slice wrapped as a dataset of its own "
        "(`LocalSliceDataset`)"),
    "_is_stateful": PrivateUse("tf.Operation", "read", "whether an op depends on state"),
    "_context_handle": PrivateUse("TensorFlow's eager context", "read",
                                  "whether the runtime has started"),
    "_execute_callbacks": PrivateUse(
        "tensorflow.python.checkpoint.checkpoint", "read", "what `Checkpoint.save` runs after "
        "a write (the `checkpoint` state file)"),
    # --- Horovod
    "_allreduce": PrivateUse("horovod.tensorflow.mpi_ops", "read",
                             "the all-reduce without Horovod's averaging and gradient"),
    "_grouped_allreduce": PrivateUse("horovod.tensorflow.mpi_ops", "read",
                                     "a group of buffers in one fused all-reduce"),
    "_reducescatter": PrivateUse("horovod.tensorflow.mpi_ops", "read",
                                 "the reduce-scatter of a sharded optimizer's gradients"),
    # --- Python and NumPy
    "_getframe": PrivateUse("sys", "read", "the tf.function being traced (`_tf.traced_function`)"),
    "_current_frames": PrivateUse("sys", "read", "every thread's stack in a hang report"),
    "_exit": PrivateUse("os", "read", "exit without running another thread's cleanup (a dead "
                        "peer's collective never returns)"),
    "_inst": PrivateUse("random", "read", "Python's global generator, per simulated rank"),
    "_rand": PrivateUse("numpy.random.mtrand", "read", "NumPy's global generator, per "
                        "simulated rank"),
}


class TensorFlowReplacement(NamedTuple):
    """One TensorFlow attribute tfdist replaces (through `tfdist._tf.replace`), and why."""

    owner: str
    name: str
    why: str


TF_REPLACEMENTS: Tuple[TensorFlowReplacement, ...] = (
    TensorFlowReplacement(
        "tf.nn", "compute_average_loss",
        "a custom loop's loss averaged without global_batch_size must be averaged over the "
        "global batch, as MultiWorkerMirroredStrategy's replica context makes it; the "
        "function reads the replica count, not the rows, and has no hook"),
    TensorFlowReplacement(
        "tensorflow.python.checkpoint.checkpoint.Checkpoint", "_write",
        "several processes saving one tf.train.Checkpoint prefix write through one temporary "
        "directory of fixed name; every public save path (save, write, CheckpointManager) "
        "goes through this method, and no option names the directory"),
)
