"""`RankProfiler`: TensorFlow's profiler on every rank of a job, one TensorBoard run per rank.

It captures TensorFlow's profiler (the trace viewer's ops, tfdist's
communication named `tfdist/<algorithm>/...`) on one rank for a range of
training batches, into `<log_dir>/rank_<k>` - a TensorBoard run of its own
per rank, shown in the profile tab, and what `tfdist.profiling.timeline`
merges. It serves a `TensorBoard` callback's `profile_batch` on every rank
of a multi-process job (`keras_patches`) and
`tfdist-run --profile DIR --profile-steps A:B` (`profiler_from_environment`).
"""

import os

import keras
import tensorflow as tf
from absl import logging

from tfdist.profiling.names import (DEFAULT_PROFILE_STEPS, PROFILE_DIR_ENV, PROFILE_STEPS_ENV,
                                    STEP_TRACE, parse_profile_steps, rank_run_dir)


class RankProfiler(keras.callbacks.Callback):
    """Profile training batches `first`..`last` (from 1 in each `fit`) into `<log_dir>/rank_<k>`.

    The same batches as `keras.callbacks.TensorBoard(profile_batch=(first,
    last))` would profile; each batch is marked as a training step for the
    profile tools. A profiler that cannot start (another one is running)
    is reported and training goes on.

    The communicator's engine timeline (Horovod's, which the TensorFlow
    profiler cannot see) is recorded over the same batches.

    Args:
        log_dir: the directory holding one run per rank.
        first, last: the batch range, inclusive.
        rank: this process's rank.
        communicator: the strategy's communicator.
    """

    def __init__(self, log_dir, first, last, rank, communicator):
        super().__init__()
        self._communicator = communicator
        self.log_dir = rank_run_dir(log_dir, rank)
        self.first, self.last = int(first), int(last)
        self._batch = 0
        self._profiling = False
        self._step_trace = None

    def on_train_begin(self, logs=None):
        self._batch = 0

    def on_train_batch_begin(self, batch, logs=None):
        self._batch += 1
        if self._batch == self.first and not self._profiling:
            try:
                os.makedirs(self.log_dir, exist_ok=True)
                tf.profiler.experimental.start(self.log_dir)
                self._profiling = True
                self._communicator.start_engine_timeline(self.log_dir)
            except Exception as error:  # pylint: disable=broad-except
                logging.error("tfdist: the profiler did not start for %s: %s", self.log_dir, error)
        if self._profiling:
            self._step_trace = tf.profiler.experimental.Trace(
                STEP_TRACE, graph_type="train", step_num=self._batch)
            self._step_trace.__enter__()

    def on_train_batch_end(self, batch, logs=None):
        if self._step_trace is not None:
            self._step_trace.__exit__(None, None, None)
            self._step_trace = None
        if self._profiling and self._batch >= self.last:
            self._stop()

    def on_train_end(self, logs=None):
        self._stop()

    def _stop(self):
        if self._profiling:
            self._profiling = False
            self._communicator.stop_engine_timeline()
            tf.profiler.experimental.stop()


def profiler_from_environment(rank, communicator):
    """The `RankProfiler` that `tfdist-run --profile` asked for (environment), or None."""
    log_dir = os.environ.get(PROFILE_DIR_ENV)
    if not log_dir:
        return None
    first, last = parse_profile_steps(os.environ.get(PROFILE_STEPS_ENV, DEFAULT_PROFILE_STEPS))
    return RankProfiler(log_dir, first, last, rank, communicator)
