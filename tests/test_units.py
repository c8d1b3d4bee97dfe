"""Single-process units: tensor fusion, gradient compression and global-batch sharding."""

import re
import time

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.comm import ports
from tfdist.launch import cli
from tfdist.aggregation.compression import FP16Compression
from tfdist.aggregation.compressors import get_compressor
from tfdist.aggregation.fusion import FusionPlan, reverse_order_buckets
from tfdist.aggregation.parameter_server import MIN_SPLIT_BYTES, ShardPlan
from tfdist.strategies.inputs.batch_slicing import shard_global_batch


def test_fusion_round_trip_groups_by_dtype_and_threshold():
    tensors = [tf.random.normal([3, 4]), tf.range(5), tf.random.normal([7]),
               tf.random.normal([2, 2, 2]), tf.constant(1.5)]
    plan = FusionPlan(tensors, bucket_bytes=64)
    flats = plan.pack(tensors)
    # float32 sizes 48, 28, 32, 4 bytes into 64-byte buckets: [48], [28 + 32 + 4]; int32: [20]
    assert [(f.dtype, int(f.shape[0])) for f in flats] == [
        (tf.float32, 12), (tf.int32, 5), (tf.float32, 16)]
    for original, restored in zip(tensors, plan.unpack(flats)):
        np.testing.assert_array_equal(original.numpy(), restored.numpy())
        assert original.shape == restored.shape


def test_fusion_default_threshold_is_one_bucket_per_dtype():
    tensors = [tf.ones([100, 100]) for _ in range(20)]
    assert len(FusionPlan(tensors).pack(tensors)) == 1


def test_reverse_order_buckets_start_small_from_the_last_tensor():
    # Layer order; the backward pass produces the last tensors first.
    sizes = [400, 30, 3000, 50, 20, 10]
    buckets = reverse_order_buckets(sizes, bucket_bytes=1000, first_bucket_bytes=64)
    # first bucket <= 64 B: [10, 20]; then <= 1000 B: [50]; 3000 B alone; [30, 400]
    assert buckets == [[5, 4], [3], [2], [1, 0]]
    assert sorted(p for b in buckets for p in b) == list(range(len(sizes)))
    assert reverse_order_buckets(sizes, 10**6) == [[5, 4, 3, 2, 1, 0]]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_shards_concatenate_to_the_global_batches(world):
    data = tf.data.Dataset.from_tensor_slices((np.arange(50), np.arange(50) * 10)).batch(12)
    shards = [list(shard_global_batch(data, r, world).as_numpy_iterator()) for r in range(world)]
    originals = list(data.as_numpy_iterator())
    for step, (x, y) in enumerate(originals):
        np.testing.assert_array_equal(np.concatenate([s[step][0] for s in shards]), x)
        np.testing.assert_array_equal(np.concatenate([s[step][1] for s in shards]), y)
        sizes = [len(s[step][0]) for s in shards]
        assert max(sizes) - min(sizes) <= 1


def test_dict_inputs_are_sharded_too():
    data = tf.data.Dataset.from_tensor_slices({"a": np.arange(8), "b": np.ones((8, 2))}).batch(8)
    first = next(iter(shard_global_batch(data, 1, 2)))
    np.testing.assert_array_equal(first["a"].numpy(), [4, 5, 6, 7])
    assert first["b"].shape == (4, 2)


def test_any_global_batch_splits_into_contiguous_slices_even_empty_ones():
    data = tf.data.Dataset.from_tensor_slices(np.arange(12)).batch(10)  # batches of 10 and 2
    slices = [[b.numpy().tolist() for b in shard_global_batch(data, r, 3)] for r in range(3)]
    assert slices[0] == [[0, 1, 2], []]
    assert slices[1] == [[3, 4, 5], [10]]
    assert slices[2] == [[6, 7, 8, 9], [11]]


def test_fp16_compression_sends_floats_as_half_and_restores_their_dtype():
    sent = []

    class OneProcessWire:  # one process: the sum over ranks is the tensor itself
        @staticmethod
        def sum(tensors):
            sent.extend(tensors)
            return tensors

    value = tf.constant([1.0, 2.5, -3.0], tf.float32)
    counts = tf.constant([3, 4], tf.int64)
    restored, same_counts = FP16Compression().reduce([value, counts], [None, None],
                                                       OneProcessWire())
    assert [t.dtype for t in sent] == [tf.float16, tf.int64]
    assert restored.dtype == tf.float32
    np.testing.assert_array_equal(restored.numpy(), value.numpy())
    assert same_counts is counts
    assert FP16Compression().wire_ratio(tf.float32) == 0.5


def test_unknown_compression_is_a_clear_error():
    with pytest.raises(ValueError, match="compression must be one of.*Got: 'int8'"):
        get_compressor("int8")
    with pytest.raises(ValueError, match="must be a name or a .*Compressor. Got: 3"):
        get_compressor(3)
    assert get_compressor(None) is None and get_compressor("none") is None


def test_a_dataset_of_single_examples_is_a_one_line_error():
    examples = tf.data.Dataset.from_tensor_slices((np.zeros((6, 3), "float32"), np.arange(6)))
    with pytest.raises(ValueError, match=r"component 1 is a scalar.*call \.batch"):
        shard_global_batch(examples, 0, 2)
    shard_global_batch(examples.batch(4), 0, 2)  # batched: fine


def test_this_process_slice_and_its_transformations_are_not_sliced_again():
    from tfdist.strategies.inputs.local_input import LocalSliceDataset, derives_from_local_slice

    batches = tf.data.Dataset.from_tensor_slices(np.arange(12.0)).batch(4)
    local = LocalSliceDataset(shard_global_batch(batches, 1, 2))
    assert [b.tolist() for b in local.as_numpy_iterator()] == [[2, 3], [6, 7], [10, 11]]
    assert derives_from_local_slice(local)
    assert derives_from_local_slice(local.map(lambda b: (b, tf.ones_like(b))).prefetch(1))
    assert not derives_from_local_slice(batches.map(lambda b: b))


def test_async_placement_balances_bytes_and_keeps_variables_whole():
    from tfdist.aggregation.parameter_server.async_client import placement

    class Variable:
        def __init__(self, *shape):
            self.shape, self.dtype = shape, "float32"

    variables = [Variable(100, 10), Variable(10), Variable(500), Variable(300), Variable(2, 2)]
    assert placement(variables, 2) == [0, 1, 1, 1, 1]  # 4000 B | 2000 + 1200 + 40 + 16 B
    assert placement(variables, 1) == [0] * 5


@pytest.mark.parametrize("kwargs,message", [
    ({"mode": "sync", "staleness": 2}, "staleness applies to mode='async' only. Got: 2"),
    ({"mode": "async", "staleness": -1}, "staleness must be None or an integer >= 0. Got: -1"),
    ({"mode": "async", "staleness": 1.5}, "Got: 1.5"),
    ({"mode": "hogwild"}, "mode must be one of"),
])
def test_parameter_server_mode_and_staleness_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        tfdist.strategies.ParameterServerStrategy(**kwargs)


def test_async_rejects_what_spans_servers():
    import keras

    from tfdist.strategies.keras_surface.steps import check_asynchronous_optimizer

    with pytest.raises(ValueError, match="global_clipnorm spans the variables"):
        check_asynchronous_optimizer(keras.optimizers.SGD(0.1, global_clipnorm=1.0))
    with pytest.raises(ValueError, match="LossScaleOptimizer"):
        check_asynchronous_optimizer(
            keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)))
    check_asynchronous_optimizer(keras.optimizers.Adam(clipnorm=1.0))  # per variable: fine


def test_stop_flags_are_exchanged_only_where_a_callback_may_decide_alone():
    """Keras' own callbacks (and tfdist's) stop from the global logs: no exchange needed.

    A user's callback, or a subclass of a trusted one, may decide on one rank
    only: its flag is agreed at the loop's and epochs' edges, and after every
    batch only if it implements a batch hook of that loop.
    """
    import keras  # pylint: disable=import-outside-toplevel

    from tfdist.strategies.keras_patches import loop_flags  # pylint: disable=import-outside-toplevel

    class MyEarlyStopping(keras.callbacks.EarlyStopping):
        pass

    class EpochLogger(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            pass

    class StopAtBatch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    def schedule(callbacks, mode="train"):
        return loop_flags.local_schedule(keras.callbacks.CallbackList(callbacks), mode)

    trusted = [keras.callbacks.EarlyStopping(), tfdist.callbacks.LearningRateWarmup(1),
               tfdist.callbacks.CommunicationMonitor(), keras.callbacks.History()]
    assert schedule(trusted) == (False, False)
    assert schedule(trusted + [EpochLogger()]) == (True, False)  # no per-batch exchange
    assert schedule([MyEarlyStopping()]) == (True, False)  # a subclass: not trusted, epoch hooks
    assert schedule([StopAtBatch()]) == (True, True)
    assert schedule([StopAtBatch()], mode="test") == (True, False)
    # Hooks given per instance count as Keras counts them.
    by_lambda = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: None)
    assert schedule([by_lambda]) == (True, True)
    assert schedule([keras.callbacks.LambdaCallback(on_epoch_end=print)]) == (True, False)


def test_call_arguments_name_the_first_that_differs():
    from tfdist.strategies.inputs import call_arguments  # pylint: disable=import-outside-toplevel

    fit = dict(batch_size=32, epochs=3, shuffle=True, class_weight={1: 2.0, 0: 1.0},
               sample_weight=np.ones(4), steps_per_epoch=None, steps_per_execution=1)
    same = call_arguments.call_signature("fit", dict(fit, class_weight={0: 1.0, 1: 2.0}))
    assert call_arguments.first_difference([call_arguments.call_signature("fit", fit),
                                            same]) is None  # dict order and arrays ignored
    other = call_arguments.call_signature("fit", dict(fit, batch_size=34))
    assert call_arguments.first_difference([same, other]) == ("batch_size", ["32", "34"])
    weights = call_arguments.call_signature("fit", dict(fit, class_weight={0: 1.0, 1: 3.0}))
    assert call_arguments.first_difference([same, weights]) == (
        "class_weight", ["<another value>", "<another value>"])
    evaluate = call_arguments.call_signature("evaluate", dict(batch_size=32, steps=None))
    assert call_arguments.first_difference([same, evaluate]) == ("call", ["fit", "evaluate"])


def test_a_model_never_runs_on_zero_rows_in_a_custom_loop():
    """`empty_slice.call_on_rows`: zero rows in, a stand-in row through the call, zero rows
    (and zero gradients) out; rows in, the call unchanged. Eager and traced for any rows."""
    from tfdist.strategies.step.empty_slice import call_on_rows  # pylint: disable=C0415

    seen = []

    def call(x, scale=1.0):
        seen.append(x.shape.as_list())
        tf.debugging.assert_positive(tf.shape(x)[0], message="a call on zero rows")
        return x * scale, tf.reduce_sum(x)

    out, total = call_on_rows(call, (tf.zeros([0, 3]),), {"scale": 2.0})
    assert out.shape == (0, 3) and seen[-1] == [1, 3] and float(total) == 0.0
    out, _ = call_on_rows(call, (tf.ones([2, 3]),), {})
    assert out.shape == (2, 3) and seen[-1] == [2, 3]

    weight = tf.Variable(3.0)

    @tf.function(input_signature=[tf.TensorSpec([None, 3])])
    def traced(x):
        with tf.GradientTape() as tape:
            out, _ = call_on_rows(lambda t: (t * weight, 0.0), (x,), {})
            loss = tf.reduce_sum(out) + weight  # a row-independent term keeps its gradient
        return tf.shape(out)[0], tape.gradient(loss, weight)

    rows, gradient = traced(tf.zeros([0, 3]))
    assert int(rows) == 0 and float(gradient) == 1.0
    rows, gradient = traced(tf.ones([2, 3]))
    assert int(rows) == 2 and float(gradient) == 7.0


# --- the parameter servers' shard plan
@pytest.mark.parametrize("num_elements,servers", [(10_000_000, 3), (1_234_567, 2), (300_001, 4),
                                                  (262_144 * 5, 5)])
def test_partition_balances_bytes_and_respects_the_message_limit(num_elements, servers):
    plan = ShardPlan(num_elements, 4, servers, piece_bytes=1 << 20)
    assert sum(plan.sizes) == num_elements
    assert max(plan.sizes) * 4 <= 1 << 20
    per_server = plan.bytes_per_server()
    assert max(per_server) <= sum(per_server) / servers + 4 * len(plan.sizes) / servers
    assert len(set(plan.servers)) == servers


def test_small_buffers_stay_whole_and_rotate_over_servers():
    small = MIN_SPLIT_BYTES // 4
    assert ShardPlan(small, 4, 3, 1 << 20, first_server=2).servers == [2]
    assert ShardPlan(small, 4, 3, 1 << 20, first_server=4).servers == [1]


# --- tfdist-run's command line (no process started)
def test_pick_ports_are_distinct_and_free():
    chosen = ports.pick_ports(5)
    assert len(set(chosen)) == 5
    assert all(ports.port_is_free(p) for p in chosen)


@pytest.mark.parametrize("argv,message", [(["-np", "2"], "no command given"),
                                          (["-np", "0", "x"], "-np must be >= 1"),
                                          (["--timeout", "0", "x"], "--timeout must be positive")])
def test_bad_command_lines_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("batch, world, per_rank_input, said", [
    (128, 2, False, "global batch 128 = 64 per process x 2; fit's batch_size is the global batch"),
    (100, 3, False, "global batch 100 = 33-34 per process x 3 (uneven slices are weighted"),
    (2, 4, False, "global batch 2 = 0-1 per process x 4 (uneven"),
    (64, 2, True, "batch 64 per process x 2 = 128 rows per step (each process feeds its own"),
])
def test_the_batch_split_is_said_in_words(batch, world, per_rank_input, said):
    from tfdist.strategies import modes  # pylint: disable=import-outside-toplevel
    from tfdist.strategies.inputs import batch_slicing

    input_mode = modes.input_mode(per_rank_input)
    assert input_mode.describe_split(batch, world).startswith(said)
    assert input_mode.global_batch_size(batch, world) == batch * (world if per_rank_input else 1)
    assert sum(batch_slicing.slice_rows(batch, r, world) for r in range(world)) == batch


def test_a_missing_tensorflow_names_the_install_extra(monkeypatch):
    import importlib.util  # pylint: disable=import-outside-toplevel

    from tfdist import versions  # pylint: disable=import-outside-toplevel

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorflow" else real_find_spec(name, *a))
    with pytest.raises(ModuleNotFoundError) as missing:
        versions.require_tensorflow()
    assert missing.value.name == "tensorflow"
    assert "no 'tensorflow' module" in str(missing.value)
    assert "tfdist[cpu]" in str(missing.value) and "tfdist[tf]" in str(missing.value)


def test_a_liveness_port_logs_a_stranger_and_answers_the_jobs_probes(caplog):
    """The MPI engine's liveness port answers nothing; the job's probes carry the token and a
    connect-only probe is quiet, while a stranger's bytes are logged once; every probe of a
    live port succeeds, a closed one is refused."""
    import logging as std_logging  # pylint: disable=import-outside-toplevel
    import socket  # pylint: disable=import-outside-toplevel

    from tfdist.comm import liveness  # pylint: disable=import-outside-toplevel

    held = ports.reserve_ports(1)[0]
    port = liveness.LivenessPort(held, b"the-token", "a liveness port")
    address = f"127.0.0.1:{held.port}"
    with caplog.at_level(std_logging.WARNING):
        assert liveness.probe_failure(address, 2.0, b"the-token") is None
        assert liveness.probe_failure(address, 2.0) is None
        time.sleep(1.2)
        assert "refused" not in caplog.text
        for _ in range(2):
            with socket.create_connection(("127.0.0.1", held.port)) as stranger:
                stranger.sendall(b"GET / HTTP/1.1\r\n\r\n")
                try:
                    assert stranger.recv(16) == b""  # nothing answered: closed by the port
                except ConnectionResetError:
                    pass  # closed with unread bytes
        time.sleep(0.5)
    assert caplog.text.count("refused a request from 127.0.0.1") == 1, caplog.text
    port.close()
    assert liveness.probe_failure(address, 2.0) == liveness.REFUSED


@pytest.mark.parametrize("argv, message", [
    (["-np", "4", "-H", "localhost:2"], "-H offers 2 slots for 4 processes"),
    (["-np", "2", "-H", "elsewhere.invalid:2", "--no-mpi"],
     "-H names other machines (elsewhere.invalid): tfdist-run starts processes there through "
     "one mpirun"),
    (["-np", "2", "-H", "elsewhere.invalid:2", "--min-np", "1"],
     "an elastic tfdist-run starts its processes on this machine"),
    (["-np", "2", "--port-range", "10-5"], "--port-range"),
    (["-np", "2", "--port-range", "2000-2100", "--port-base", "3000"], "cannot go together"),
    (["-np", "2", "--network-interface", "no-such-interface0"], "no such interface"),
])
def test_tfdist_run_refuses_hosts_and_ports_it_cannot_use_by_name(argv, message, capsys):
    with pytest.raises(SystemExit):
        cli.main(argv + ["python", "-c", "pass"])
    assert message in capsys.readouterr().err


def test_tfdist_run_with_this_machine_alone_in_its_host_list_runs_here():
    parser = cli.build_parser()
    args = parser.parse_args(["-np", "2", "-H", "localhost:1,127.0.0.1:1", "python", "x.py"])
    cli.validate(args, parser)
    assert args.remote_hosts == []
