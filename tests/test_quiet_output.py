"""Quiet output where tfdist-run does not filter: TensorFlow's notices and library warnings.

In-process checks of `tfdist.quiet_output`'s decisions; the multi-process
check (a job under mpirun prints no start-up notice and one copy of a Keras
warning) is `test_launchers.test_mpirun_output_is_as_quiet_as_tfdist_run`.
"""

import warnings

import pytest

from tfdist import cluster, quiet_output

MPI_RANK_1 = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}


@pytest.mark.parametrize("environ, modules, sets", [
    (MPI_RANK_1, {}, True),
    (dict(MPI_RANK_1, OMPI_COMM_WORLD_RANK="0"), {}, True),     # the chief's notices too
    (MPI_RANK_1, {"tensorflow": None}, False),                   # too late: already imported
    (dict(MPI_RANK_1, TF_CPP_MIN_LOG_LEVEL="0"), {}, False),     # the user's choice
    (dict(MPI_RANK_1, TFDIST_VERBOSE="1"), {}, False),
    ({"TFDIST_RANK": "1", "TFDIST_WORLD_SIZE": "2",
      "TFDIST_WORKER_ADDRESSES": "a:1,b:2"}, {}, False),         # tfdist-run filters itself
    ({}, {}, False),                                             # one process
    ({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"}, {}, False),  # reported later
])
def test_tensorflow_notices_are_switched_off_only_where_nobody_filters(environ, modules, sets):
    before = dict(environ)
    environ = dict(environ)
    assert quiet_output.before_tensorflow(environ, modules) is sets
    expected = dict(before, TF_CPP_MIN_LOG_LEVEL="1") if sets else before
    assert environ == expected  # nothing else touched; the user's own level kept


def _shown(spec, module):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_output.after_discovery(spec, environ={})
        warnings.warn_explicit("the same on every rank", UserWarning, "x.py", 1, module=module)
    return len(seen)


@pytest.mark.parametrize("launcher", ["mpirun", "srun", "horovodrun", "TF_CONFIG", "kubernetes"])
def test_library_warnings_show_on_rank_0_only(launcher):
    rank1 = cluster.Cluster(1, 2, launcher=launcher)
    assert _shown(rank1, "keras.src.trainers.epoch_iterator") == 0
    assert _shown(rank1, "tensorflow.python.ops") == 0
    assert _shown(rank1, "__main__") == 1  # the user's own warnings: every rank
    assert _shown(rank1, "kerasish_user_module") == 1
    assert _shown(cluster.Cluster(0, 2, launcher=launcher), "keras.src.x") == 1


def test_tfdist_run_and_single_processes_keep_every_warning():
    assert _shown(cluster.Cluster(1, 2, launcher="tfdist-run"), "keras.src.x") == 1
    assert _shown(cluster.Cluster(0, 1, launcher="single"), "keras.src.x") == 1
