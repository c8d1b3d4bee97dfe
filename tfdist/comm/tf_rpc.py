"""Remote calls over TensorFlow's RPC runtime (`tf.distribute.experimental.rpc`, gRPC).

A server registers `tf.function`s with fixed input signatures; clients call
them by name, eagerly or inside a compiled function (the call is an op:
`RpcCall` + `RpcGetValue`, asynchronous in the graph). gRPC rejects messages
over 4 MiB by default, so callers keep every tensor they send or receive
below `MAX_MESSAGE_BYTES`.

Every call carries the job's token first (`serve`, `RpcClient`): a server answers only
its job's processes, and counts the calls it refused (TensorFlow's RPC runtime has no
authentication of its own; this one is tfdist's, over it).

The server answers each call on a gRPC thread that waits for the function to
finish; functions that wait (a queue dequeue) therefore hold a gRPC thread
(gRPC adds threads as needed) but no TensorFlow inter-op thread: queue
operations are asynchronous kernels. So blocking calls cannot starve the
executor, whatever the number of clients.
"""

import tensorflow as tf

from tfdist import env_vars

MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # gRPC's default limit per message
_rpc = tf.distribute.experimental.rpc


def serve(address, methods, token=""):
    """Start an RPC server on `address` exposing `methods` ({name: tf.function with an input
    signature}), each answering only calls that carry `token` (the job's secret's, from
    `tfdist.process_setup.job_secret.token`; "" without a secret) as their first argument.

    Returns the `RpcServer`; it stops when the object is garbage collected or the process
    exits.
    """
    server = _rpc.Server.create("grpc", address)
    with tf.init_scope():
        refused = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfdist_rpc_refused")
    for name, function in methods.items():
        server.register(name, _requiring(function, token, refused))
    server.start()
    return RpcServer(server, refused)


class RpcServer:
    """A started RPC server (`serve`) and the count of calls it refused."""

    def __init__(self, server, refused):
        self._server = server
        self._refused = refused

    def refused_calls(self):
        """How many calls arrived without the job's token (eager)."""
        return int(self._refused.numpy())


def _requiring(function, token, refused):
    """`function` behind a check of its caller's token: a call without it fails (the caller
    reads the error) and is counted; the server goes on."""
    signature = [tf.TensorSpec([], tf.string)] + list(function.input_signature)

    @tf.function(input_signature=signature)
    def checked(presented, *args):
        accepted = tf.equal(presented, token)
        counted = tf.cond(accepted, lambda: tf.constant(0, tf.int64),
                          lambda: refused.assign_add(1))
        with tf.control_dependencies([counted]):
            check = tf.debugging.Assert(accepted, [REFUSAL])
        with tf.control_dependencies([check]):
            return function(*args)

    return checked


REFUSAL = f"tfdist: call refused: it does not carry the job's secret ({env_vars.SECRET})"


class RpcClient:
    """Calls the functions of one RPC server; failures name the server.

    Args:
        address: "host:port" of the server.
        description: how errors name the server, e.g. "parameter server 1 (host:port)".
        caller: how errors name this process, e.g. "tfdist rank 2".
        timeout: seconds any call (and the initial connection) may take.
        token: what every call carries first, as the server asks (`serve`).
    """

    def __init__(self, address, description, caller, timeout, token=""):
        self.address = address
        self.token = token
        self.description = description
        self.caller = caller
        self.timeout_ms = int(timeout * 1000)
        # Created eagerly, the client lists the server's methods: this waits (up to
        # the timeout) for the server to answer.
        try:
            self._client = _rpc.Client.create("grpc", address, timeout_in_ms=self.timeout_ms)
        except tf.errors.OpError as e:
            raise ConnectionError(
                f"{caller}: {description} did not answer within {timeout:g} s: "
                f"{e.message.splitlines()[0]}"
            ) from None

    def call(self, method, args, output_specs, timeout=None):
        """Call `method(*args)`; the result follows `output_specs`.

        A failed call (server gone, deadline exceeded, error in the
        function) raises an error that names the server and the method.
        Calls in flight fail as soon as the server's connection drops; a new
        call to a server that is gone waits for it up to `timeout` seconds
        (default: the client's).
        """
        timeout_ms = self.timeout_ms if timeout is None else int(timeout * 1000)
        result = self._client.call(method, [tf.constant(self.token)] + list(args), output_specs,
                                   timeout_in_ms=timeout_ms)
        code, message = result.get_error()
        check = tf.debugging.Assert(
            tf.equal(code, 0),
            [f"{self.caller}: {self.description} failed in {method!r} (it died, was stopped "
             "after an error it reports, or took longer than the "
             f"{timeout_ms / 1000:g} s timeout):", message],
        )
        with tf.control_dependencies([check]):
            return tf.nest.map_structure(tf.identity, result.get_value())
