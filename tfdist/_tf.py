"""The one module that imports TensorFlow's private APIs.

A custom `tf.distribute.Strategy` and cross-process collectives cannot be built
from TensorFlow's public API alone. Everything private that tfdist needs is
imported here, so that a TensorFlow upgrade touches this file only; and the
TensorFlow attributes tfdist replaces are replaced here (`replace`), only at
the points `tfdist.private_surface.TF_REPLACEMENTS` declares.
"""

import os

from tensorflow.core.protobuf import cluster_pb2
from tensorflow.core.protobuf import tensorflow_server_pb2
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.data.ops import iterator_ops
from tensorflow.python.distribute import distribute_lib
from tensorflow.python.distribute import one_device_strategy
from tensorflow.python.distribute import reduce_util
from tensorflow.python import pywrap_tfe
from tensorflow.python.eager import context
from tensorflow.python.framework import op_callbacks
from tensorflow.python.framework import ops as framework_ops
from tensorflow.python.ops import collective_ops
from tensorflow.python.ops import control_flow_v2_func_graphs
from tensorflow.python.training.saving import saveable_object
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from tfdist.env_vars import Foreign
from tfdist.private_surface import TF_REPLACEMENTS

OneDeviceStrategy = one_device_strategy.OneDeviceStrategy
OneDeviceExtended = one_device_strategy.OneDeviceExtended
ReplicaContext = distribute_lib.ReplicaContext
ReduceOp = reduce_util.ReduceOp
UnaryUnchangedStructureDataset = dataset_ops.UnaryUnchangedStructureDataset
OwnedIterator = iterator_ops.OwnedIterator  # what iter(dataset) returns eagerly
EagerTensor = framework_ops.EagerTensor
XSpace = xplane_pb2.XSpace  # the profiler's file format (*.xplane.pb)

all_reduce_v2 = collective_ops.all_reduce_v2
all_gather_v2 = collective_ops.all_gather_v2
broadcast_send_v2 = collective_ops.broadcast_send_v2
broadcast_recv_v2 = collective_ops.broadcast_recv_v2
# Called after every op this thread runs eagerly or adds to a graph (what tfdbg uses).
add_op_callback = op_callbacks.add_op_callback


def remove_op_callback(callback):
    """Remove this thread's op `callback`, leaving eager ops' slow path calling callbacks.

    TensorFlow's own `remove_op_callback` switches that path back process-wide
    once the calling thread has no callback left, so another thread's
    callbacks (ranks simulated as threads) would miss ops; running the empty
    list of a thread without callbacks costs nothing measurable.
    """
    context.context().remove_op_callback(callback)


def has_gradient(op):
    """False for a graph op TensorFlow declares not differentiable (`tf.no_gradient`)."""
    try:
        return framework_ops.get_gradient_function(op) is not None
    except LookupError:
        return True  # no gradient registered at all: asking for one would fail, not skip


def a_tape_records():
    """True while a `GradientTape` (or forward accumulator) of this thread records."""
    return not pywrap_tfe.TFE_Py_TapeSetIsEmpty()


def in_replica_context_of(extended):
    """True inside `extended`'s replica context (i.e. inside `strategy.run`)."""
    ctx = distribute_lib.get_replica_context()
    return ctx is not None and ctx.strategy.extended is extended


def start_collective_server(worker_addresses, rank, leader_rank=0):
    """Start this process's gRPC server and enable cross-process collectives.

    The cluster is a single job named "worker" with one task per training
    process; collectives are led by `leader_rank` (group resolution happens
    there). Must be called once, before any collective op runs.
    """
    cluster = cluster_pb2.ClusterDef()
    job = cluster.job.add(name="worker")
    for index, address in enumerate(worker_addresses):
        job.tasks[index] = address
    port = int(worker_addresses[rank].rsplit(":", 1)[1])
    # Bind beside the launcher's (or this process's) reservation of the port, which holds it
    # from its choice until now (`tfdist.comm.ports.PortReservation`).
    os.environ.setdefault(Foreign.TF_GRPC_REUSE_PORT.name, "1")
    ctx = context.context()
    ctx.configure_collective_ops(
        collective_leader=f"/job:worker/replica:0/task:{leader_rank}",
        scoped_allocator_enabled_ops=("CollectiveReduce",),
        device_filters=(f"/job:worker/task:{rank}",),
    )
    server_def = tensorflow_server_pb2.ServerDef(
        cluster=cluster,
        default_session_config=ctx.config,
        job_name="worker",
        task_index=rank,
        protocol="grpc",
        port=port,
    )
    ctx.enable_collective_ops(server_def)
    ctx.ensure_initialized()


def check_peer_health(task_name, timeout_seconds):
    """Raise a `tf.errors.OpError` if the collective peer `task_name` is down."""
    context.context().check_collective_ops_peer_health(
        task_name, timeout_in_ms=int(timeout_seconds * 1000)
    )


def abort_collectives(code, message):
    """Make every pending and future collective in this process fail with `message`."""
    context.context().abort_collective_ops(code, message)


def global_seed_is_set():
    """True when the user set a TensorFlow global seed (`tf.random.set_seed`).

    Read without `random_seed.get_seed`, which would draw an op seed: the next
    unseeded random op (a user's `Dataset.shuffle`) would then get another
    seed than in the same script without tfdist.
    """
    if context.executing_eagerly():
        return context.global_seed() is not None
    from tensorflow.python.framework import ops

    return ops.get_default_graph().seed is not None


def static_batch_size(dataset):
    """The batch size of a batched `dataset` (a scalar tensor, -1 if unknown)."""
    from tensorflow.python.data.experimental.ops import distribute as data_distribute

    return data_distribute.compute_batch_size(dataset)


def auto_shard_dataset(dataset, input_context):
    """tf.data's auto-sharding (by file where the policy and pipeline allow)."""
    from tensorflow.python.distribute import input_ops

    return input_ops.auto_shard_dataset(
        dataset, input_context.num_input_pipelines, input_context.input_pipeline_id,
        input_context.num_replicas_in_sync,
    )


_replaced = set()  # (owner, name) of the TensorFlow attributes replaced so far


def _tf_owner(owner):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tensorflow.python.checkpoint import checkpoint as checkpoint_module

    return {"tf.nn": tf.nn, "tensorflow.python.checkpoint.checkpoint.Checkpoint":
            checkpoint_module.Checkpoint}[owner]


def original(owner, name):
    """The current value of a declared TensorFlow replacement point (what `replace` wraps)."""
    _declared(owner, name)
    return getattr(_tf_owner(owner), name)


def replace(owner, name, replacement):
    """Set TensorFlow's `owner.name` to `replacement`: only a point declared in
    `tfdist.private_surface.TF_REPLACEMENTS` (with why TensorFlow has no hook there)."""
    _declared(owner, name)
    setattr(_tf_owner(owner), name, replacement)
    _replaced.add((owner, name))


def replaced():
    """The TensorFlow points replaced so far, as (owner, name)."""
    return set(_replaced)


def _declared(owner, name):
    if not any(point.owner == owner and point.name == name for point in TF_REPLACEMENTS):
        raise RuntimeError(f"tfdist: {owner}.{name} is replaced but not declared in "
                           "tfdist/private_surface.TF_REPLACEMENTS")


def wrap_checkpoint_writes(wrapper):
    """Route every `tf.train.Checkpoint` file write through `wrapper(write, checkpoint, prefix, options)`.

    `Checkpoint.save` and `Checkpoint.write` (and `tf.train.CheckpointManager`)
    all write through the private `Checkpoint._write`, which also updates the
    directory's `checkpoint` state file for `save`.
    """
    owner = "tensorflow.python.checkpoint.checkpoint.Checkpoint"
    write = original(owner, "_write")

    def _write(self, file_prefix, options=None):
        return wrapper(write, self, file_prefix, options)

    replace(owner, "_write", _write)


def run_checkpoint_write_callbacks(callbacks, save_path):
    """What `tf.train.Checkpoint` runs after a write (`save` updates the `checkpoint` file)."""
    from tensorflow.python.checkpoint import checkpoint as checkpoint_module

    checkpoint_module._execute_callbacks(callbacks, save_path)  # pylint: disable=protected-access


def traced_function():
    """(The innermost `tf.function` being traced on this thread, the FuncGraph of its trace).

    (None, None) when nothing is traced (eager execution, `tf.init_scope`) or
    the trace is not a `tf.function`'s. Found from the Python stack: the
    tracing frames of `tf.function` are methods of its `Function` object,
    and the trace's graph is the `FuncGraph` named after it (a `tf.cond` or
    `tf.while_loop` inside adds graphs of its own, nested in it).
    """
    import sys  # pylint: disable=import-outside-toplevel

    from tensorflow.python.eager.polymorphic_function import polymorphic_function
    from tensorflow.python.framework import func_graph
    from tensorflow.python.framework import ops

    if context.executing_eagerly():
        return None, None
    frame, function = sys._getframe(1), None  # pylint: disable=protected-access
    while frame is not None and function is None:
        if "self" in frame.f_code.co_varnames[:1]:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, polymorphic_function.Function):
                function = candidate
        frame = frame.f_back
    if function is None:
        return None, None
    name = getattr(function, "_name", None)
    graph = ops.get_default_graph()
    while isinstance(graph, func_graph.FuncGraph):
        if type(graph) is func_graph.FuncGraph and graph.name == name:  # pylint: disable=unidiomatic-typecheck
            return function, graph
        graph = graph.outer_graph
    return None, None


def has_ancestor(tensor, matches, skip=lambda op: False, control_inputs=False):
    """True if `matches(op)` for an op graph `tensor` is computed from (its own op
    included), not walking past ops where `skip(op)`; through control inputs too if
    `control_inputs`. Cost: one walk over the ancestors, each op once."""
    pending, seen = [tensor.op], set()
    while pending:
        op = pending.pop()
        if op in seen:
            continue
        seen.add(op)
        if matches(op):
            return True
        if skip(op):
            continue
        pending.extend(t.op for t in op.inputs)
        if control_inputs:
            pending.extend(op.control_inputs)
    return False


def computable_ahead(tensor):
    """True if graph `tensor` depends on no input, variable or stateful op of its graph
    (TensorFlow's graph optimizer may then compute it, and what it feeds, ahead)."""
    return not has_ancestor(
        tensor, lambda op: op.type in ("Placeholder", "ReadVariableOp") or op._is_stateful,  # pylint: disable=protected-access
        control_inputs=True)


def runtime_started():
    """Whether TensorFlow's eager runtime (its context: devices, thread pools) has started."""
    return context.context()._context_handle is not None  # pylint: disable=protected-access


def in_cond_branch():
    """True while a branch of a `tf.cond` is being traced (at any depth of functions): its ops
    get, when TensorFlow inlines the branch, node names prefixed with a node number of the
    enclosing graph, which differs between processes whose graphs differ."""
    graph = framework_ops.get_default_graph()
    while graph is not None:
        if isinstance(graph, control_flow_v2_func_graphs.CondBranchFuncGraph):
            return True
        graph = getattr(graph, "outer_graph", None)
    return False


def lazy_save_spec(produce, dtype, device):
    """A checkpoint entry whose tensor `produce()` makes only when the checkpoint is written
    (a restore, which asks for the entries too, never calls it)."""
    return saveable_object.SaveSpec(tensor=produce, slice_spec="", name="VARIABLE_VALUE",
                                    dtype=dtype, device=device)
