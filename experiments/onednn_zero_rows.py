"""Which Keras layers abort or fail on a batch of zero rows under TensorFlow's oneDNN kernels? Pooling gradients abort (see results/onednn_zero_rows.json).

A rank of a data-parallel job gets a slice of zero rows whenever the last
global batch has fewer rows than processes. TensorFlow's oneDNN ("MKL") CPU
kernels, on by default on x86 CPUs with AVX-512 VNNI or BF16 and forced on
anywhere with TF_ENABLE_ONEDNN_OPTS=1, do not all handle a zero-row tensor:
some abort the process (a CHECK failure, exit 134), which no Python code can
catch. This sweep runs each common Keras layer's forward pass, and its
backward pass to the input and to every trainable weight, on a (0, ...)
batch, inside a `tf.function` traced for any batch size (as a custom loop's
step is) and eagerly, once with oneDNN forced on and
once forced off, each layer in its own attempt: a child process runs the
cases in order and prints a line before and after each, so an abort is
attributed to the case it happened in and the sweep goes on in a new child.

    .venv/bin/python -m experiments.onednn_zero_rows [--cases a,b]

Writes experiments/results/onednn_zero_rows.json: per setting and case,
"ok", "abort" (the process died; the last lines of its stderr are kept) or
"error: <message>" (a Python exception), plus the TensorFlow version and the
CPU flags that select oneDNN's kernels. `onednn_maxpool_grad_repro.py`
beside it is the minimal upstream reproduction of the abort.
"""

import argparse
import json
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "onednn_zero_rows.json")


def layer_cases():
    """name -> (layer factory, input shape without the batch, input dtype)."""
    from keras import layers  # pylint: disable=import-outside-toplevel

    def seq(n=5, d=4):
        return (n, d)

    return {
        "MaxPooling1D": (lambda: layers.MaxPooling1D(), seq(), "float32"),
        "MaxPooling2D": (lambda: layers.MaxPooling2D(), (4, 4, 3), "float32"),
        "MaxPooling3D": (lambda: layers.MaxPooling3D(), (4, 4, 4, 2), "float32"),
        "AveragePooling1D": (lambda: layers.AveragePooling1D(2), seq(), "float32"),
        "AveragePooling2D": (lambda: layers.AveragePooling2D(2), (4, 4, 3), "float32"),
        "AveragePooling3D": (lambda: layers.AveragePooling3D(2), (4, 4, 4, 2), "float32"),
        "MaxPooling2D_same": (lambda: layers.MaxPooling2D(padding="same"), (5, 5, 3), "float32"),
        "GlobalMaxPooling2D": (lambda: layers.GlobalMaxPooling2D(), (4, 4, 3), "float32"),
        "GlobalAveragePooling2D": (lambda: layers.GlobalAveragePooling2D(), (4, 4, 3),
                                   "float32"),
        "GlobalAveragePooling1D": (lambda: layers.GlobalAveragePooling1D(), seq(), "float32"),
        "Conv1D": (lambda: layers.Conv1D(3, 2), seq(), "float32"),
        "Conv2D": (lambda: layers.Conv2D(3, 3, activation="relu"), (5, 5, 2), "float32"),
        "Conv2D_strided_same": (lambda: layers.Conv2D(3, 3, strides=2, padding="same"),
                                (6, 6, 2), "float32"),
        "Conv2D_dilated": (lambda: layers.Conv2D(3, 2, dilation_rate=2), (6, 6, 2), "float32"),
        "Conv3D": (lambda: layers.Conv3D(2, 2), (4, 4, 4, 2), "float32"),
        "Conv1DTranspose": (lambda: layers.Conv1DTranspose(3, 2), seq(), "float32"),
        "Conv2DTranspose": (lambda: layers.Conv2DTranspose(3, 3, strides=2), (4, 4, 2),
                            "float32"),
        "Conv3DTranspose": (lambda: layers.Conv3DTranspose(2, 2), (3, 3, 3, 2), "float32"),
        "SeparableConv1D": (lambda: layers.SeparableConv1D(3, 2), seq(), "float32"),
        "SeparableConv2D": (lambda: layers.SeparableConv2D(3, 3), (5, 5, 2), "float32"),
        "DepthwiseConv1D": (lambda: layers.DepthwiseConv1D(2), seq(), "float32"),
        "DepthwiseConv2D": (lambda: layers.DepthwiseConv2D(3), (5, 5, 2), "float32"),
        "Dense": (lambda: layers.Dense(3), (4,), "float32"),
        "Dense_3d": (lambda: layers.Dense(3), seq(), "float32"),
        "EinsumDense": (lambda: layers.EinsumDense("ab,bc->ac", output_shape=3), (4,),
                        "float32"),
        "Embedding": (lambda: layers.Embedding(10, 3), (5,), "int32"),
        "BatchNormalization": (lambda: layers.BatchNormalization(), (4,), "float32"),
        "BatchNormalization_conv": (lambda: layers.BatchNormalization(), (4, 4, 3), "float32"),
        "LayerNormalization": (lambda: layers.LayerNormalization(), (4,), "float32"),
        "LayerNormalization_seq": (lambda: layers.LayerNormalization(), seq(), "float32"),
        "GroupNormalization": (lambda: layers.GroupNormalization(groups=2), (4, 4, 4),
                               "float32"),
        "UnitNormalization": (lambda: layers.UnitNormalization(), (4,), "float32"),
        "SimpleRNN": (lambda: layers.SimpleRNN(3), seq(), "float32"),
        "LSTM": (lambda: layers.LSTM(3), seq(), "float32"),
        "LSTM_sequences": (lambda: layers.LSTM(3, return_sequences=True), seq(), "float32"),
        "GRU": (lambda: layers.GRU(3), seq(), "float32"),
        "Bidirectional_LSTM": (lambda: layers.Bidirectional(layers.LSTM(3)), seq(), "float32"),
        "ConvLSTM1D": (lambda: layers.ConvLSTM1D(2, 2), (3, 5, 2), "float32"),
        "ConvLSTM2D": (lambda: layers.ConvLSTM2D(2, 2), (3, 4, 4, 2), "float32"),
        "MultiHeadAttention": (lambda: _SelfAttention(layers.MultiHeadAttention(2, 4)), seq(),
                               "float32"),
        "GroupQueryAttention": (lambda: _SelfAttention(layers.GroupQueryAttention(4, 2, 1)),
                                seq(), "float32"),
        "Attention": (lambda: _SelfAttention(layers.Attention(), pair=True), seq(), "float32"),
        "AdditiveAttention": (lambda: _SelfAttention(layers.AdditiveAttention(), pair=True),
                              seq(), "float32"),
        "Dropout": (lambda: layers.Dropout(0.5), (4,), "float32"),
        "UpSampling2D": (lambda: layers.UpSampling2D(), (3, 3, 2), "float32"),
        "UpSampling2D_bilinear": (lambda: layers.UpSampling2D(interpolation="bilinear"),
                                  (3, 3, 2), "float32"),
        "ZeroPadding2D": (lambda: layers.ZeroPadding2D(), (3, 3, 2), "float32"),
        "Cropping2D": (lambda: layers.Cropping2D(1), (4, 4, 2), "float32"),
        "Resizing": (lambda: layers.Resizing(6, 6), (3, 3, 2), "float32"),
        "Flatten": (lambda: layers.Flatten(), (3, 3, 2), "float32"),
        "Softmax": (lambda: layers.Softmax(), (4,), "float32"),
        "ReLU": (lambda: layers.ReLU(), (4,), "float32"),
        "LeakyReLU": (lambda: layers.LeakyReLU(), (4,), "float32"),
        "ELU": (lambda: layers.ELU(), (4,), "float32"),
        "PReLU": (lambda: layers.PReLU(), (4,), "float32"),
        "Activation_gelu": (lambda: layers.Activation("gelu"), (4,), "float32"),
        "Activation_swish": (lambda: layers.Activation("swish"), (4,), "float32"),
    }


class _SelfAttention:
    """An attention layer called as self-attention (query = value = key = x)."""

    def __init__(self, layer, pair=False):
        self.layer, self.pair = layer, pair

    def __call__(self, x, training=None):
        if self.pair:
            return self.layer([x, x], training=training)
        return self.layer(x, x, training=training)

    @property
    def trainable_weights(self):
        return self.layer.trainable_weights


def run_case(name, mode):
    """Forward and backward of case `name` on zero rows (after building on two rows)."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    factory, shape, dtype = layer_cases()[name]
    layer = factory()

    def inputs(rows):
        if dtype == "int32":
            return tf.constant(np.ones((rows,) + shape, "int32"))
        return tf.constant(np.random.default_rng(0).normal(size=(rows,) + shape)
                           .astype(dtype))

    layer(inputs(2), training=True)  # build on rows, as a model is built

    def step(x):
        with tf.GradientTape() as tape:
            if dtype != "int32":
                tape.watch(x)
            y = layer(x, training=True)
            loss = tf.reduce_sum(y)
        sources = list(layer.trainable_weights) + ([x] if dtype != "int32" else [])
        grads = tape.gradient(loss, sources)
        return [loss] + [g for g in grads if g is not None]

    # A custom loop's tf.function sees the batch dimension as unknown (a distributed
    # dataset's element spec), so the graph is traced for any number of rows.
    compiled = (tf.function(step, input_signature=[tf.TensorSpec((None,) + shape, dtype)])
                if mode == "graph" else step)
    results = compiled(inputs(0))
    for value in results:
        (tf.convert_to_tensor(value) if not isinstance(value, tf.IndexedSlices)
         else value.values).numpy()


def _cause(error):
    """The line of an error message that says what went wrong (TensorFlow's are long)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if any(word in line for word in ("shape", "Shape", "must be", "Check", "Biases")):
            return line.replace("\x1b[1m", "").replace("\x1b[0m", "")[:240]
    return lines[0][:240] if lines else ""


def child(cases, mode):
    for name in cases:
        print(f"START {name}", flush=True)
        try:
            run_case(name, mode)
            print(f"OK {name}", flush=True)
        except Exception as error:  # pylint: disable=broad-except
            print(f"ERROR {name} {type(error).__name__}: {_cause(error)}", flush=True)


def sweep(cases, onednn, mode):
    """case -> outcome, each attempt in a child with TF_ENABLE_ONEDNN_OPTS=onednn."""
    outcomes, remaining = {}, list(cases)
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=onednn, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.path.dirname(HERE))
    while remaining:
        done = subprocess.run(
            [sys.executable, "-m", "experiments.onednn_zero_rows", "--child", mode,
             "--cases", ",".join(remaining)],
            env=env, capture_output=True, text=True, timeout=900, check=False)
        started = None
        for line in done.stdout.splitlines():
            kind, _, rest = line.partition(" ")
            name = rest.split(" ", 1)[0]
            if kind == "START":
                started = name
            elif kind == "OK":
                outcomes[name], started = "ok", None
            elif kind == "ERROR":
                outcomes[name], started = "error: " + rest.split(" ", 1)[1], None
        if started is None:
            if done.returncode != 0:
                raise RuntimeError(f"the sweep's child failed outside a case:\n{done.stderr}")
            break
        tail = [line for line in done.stderr.splitlines() if line.strip()][-3:]
        outcomes[started] = f"abort (exit {done.returncode}): " + " | ".join(tail)[-400:]
        remaining = remaining[remaining.index(started) + 1:]
    return outcomes


def cpu_flags():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    return sorted(f for f in flags if f.startswith(("avx", "amx")))
    except OSError:
        pass
    return []


def cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="")
    parser.add_argument("--child", choices=("graph", "eager"))
    args = parser.parse_args()
    if args.child:
        child([c for c in args.cases.split(",") if c], args.child)
        return
    from benchmarks.harness import environment  # pylint: disable=import-outside-toplevel

    cases = [c for c in args.cases.split(",") if c] or list(layer_cases())
    report = {
        "question": __doc__.splitlines()[0],
        "environment": environment(),
        "cpu": cpu_model(), "cpu_flags": cpu_flags(),
        "outcomes": {},
    }
    for onednn in ("1", "0"):
        for mode in ("graph", "eager"):
            key = f"TF_ENABLE_ONEDNN_OPTS={onednn} {mode}"
            report["outcomes"][key] = sweep(cases, onednn, mode)
            failed = {k: v for k, v in report["outcomes"][key].items() if v != "ok"}
            print(f"{key}: {len(cases) - len(failed)} ok, failed: {json.dumps(failed, indent=1)}",
                  flush=True)
    if not args.cases:
        os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
        with open(RESULTS, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=1)
        print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
