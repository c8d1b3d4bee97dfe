"""What travels between parameter-server workers and shard servers.

A shard server exposes these functions over TensorFlow's RPC runtime
(`tfdist.comm.tf_rpc`), per wire dtype:

* `push_<wire>(worker, slot, step, values)`: a worker's piece `slot` of
  step `step` (a flat tensor);
* `pull_<wire>(worker)`: the next sum for this worker, as (slot, step,
  values); a slot of `STOPPED_SLOT` means the server stopped because the
  worker whose rank is in `step` is gone;
* `checkin(worker, state)`: `HELLO` when a worker starts, `GOODBYE` when it
  is done (the server stops once every worker said goodbye);
* `stats()`: [process id, bytes received, pieces received, asynchronous updates applied].

Tensors travel as float16 if they are float16, else as float32 (`wire_of`). Every call
carries the job's token first (`tfdist.comm.tf_rpc`; `TOKEN_PURPOSE` under the job's secret):
a server refuses calls without it.
"""

import tensorflow as tf

WIRE_DTYPES = {"f32": tf.float32, "f16": tf.float16}
HELLO, GOODBYE = 1, 2  # check-in states
STOPPED_SLOT = -1  # a pull answered with this slot: the server stopped; step = the dead worker
TOKEN_PURPOSE = "tfdist parameter server"  # what the calls' token is derived for (`job_secret`)
QUEUE_CAPACITY = 1 << 20  # elements a server's request, reply and permit queues may hold


def by_worker(worker, num_workers, branch):
    """`branch(w)` for the rank `worker` (an int32 tensor) of 0..num_workers-1, in-graph:
    a server's per-worker queues are Python lists, indexed by a tensor through a switch."""
    return tf.switch_case(worker, [lambda w=w: branch(w) for w in range(num_workers)])


def wire_of(dtype):
    """(wire name, wire dtype) a tensor of `dtype` travels as."""
    return ("f16", tf.float16) if dtype == tf.float16 else ("f32", tf.float32)


def push_method(wire):
    return f"push_{wire}"


def pull_method(wire):
    return f"pull_{wire}"


def pull_specs(wire):
    return (tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.int64),
            tf.TensorSpec([None], WIRE_DTYPES[wire]))
