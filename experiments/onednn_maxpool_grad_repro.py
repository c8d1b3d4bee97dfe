"""Minimal reproduction, plain TensorFlow: oneDNN's MaxPool gradient aborts the process on zero rows (and oneDNN's Conv2D returns a wrongly shaped result).

Upstream-ready report for TensorFlow. Seen with tensorflow-cpu 2.21.0 on x86-64
Linux (Python 3.11), on CPUs where TensorFlow turns its oneDNN kernels on by
default (the CPU flags avx512_vnni / avx512_bf16 / amx: AMD EPYC with AVX-512,
Intel Xeon Sapphire Rapids) and on any x86-64 CPU with TF_ENABLE_ONEDNN_OPTS=1:

    TF_ENABLE_ONEDNN_OPTS=1 python onednn_maxpool_grad_repro.py maxpool  # aborts, exit 134
    TF_ENABLE_ONEDNN_OPTS=0 python onednn_maxpool_grad_repro.py maxpool  # grad shape (0, 4, 4, 4)
    TF_ENABLE_ONEDNN_OPTS=1 python onednn_maxpool_grad_repro.py conv     # (0, 5, 5, 2): wrong
    TF_ENABLE_ONEDNN_OPTS=0 python onednn_maxpool_grad_repro.py conv     # (0, 3, 3, 3)

Expected: the gradient of a max pool over a (0, 4, 4, 4) batch is a (0, 4, 4, 4)
tensor; a 3x3 VALID convolution of a (0, 5, 5, 2) batch with 3 filters has shape
(0, 3, 3, 3). With oneDNN, the first fails a CHECK inside
`MklMaxPoolingGradOp<>::Compute()` ("Check failed ... CheckTypeAndIsAligned")
and aborts the process; the second returns the input's shape, so the next op
fails with "Incompatible shapes" (or, in a graph, "ReluGrad must have the same
size and shape"). With 1 row or more, or with oneDNN off, both are right. The
sweep over Keras layers is `onednn_zero_rows.py`.
"""

import sys

import tensorflow as tf


@tf.function(input_signature=[tf.TensorSpec([None, 4, 4, 4], tf.float32)])
def max_pool_gradient(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        total = tf.reduce_sum(tf.nn.max_pool2d(x, ksize=2, strides=2, padding="VALID"))
    return tape.gradient(total, x)


@tf.function(input_signature=[tf.TensorSpec([None, 5, 5, 2], tf.float32)])
def convolution(x):
    return tf.nn.conv2d(x, tf.ones([3, 3, 2, 3]), strides=1, padding="VALID")


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "maxpool"
    print("tensorflow", tf.__version__, flush=True)
    if what == "maxpool":
        print("max pool gradient on 2 rows:", max_pool_gradient(tf.ones([2, 4, 4, 4])).shape)
        print("max pool gradient on 0 rows:", flush=True)
        print(max_pool_gradient(tf.ones([0, 4, 4, 4])).shape)
    else:
        print("conv2d on 2 rows:", convolution(tf.ones([2, 5, 5, 2])).shape)
        print("conv2d on 0 rows:", convolution(tf.ones([0, 5, 5, 2])).shape)


if __name__ == "__main__":
    main()
