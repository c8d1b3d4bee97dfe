"""Quiet output where tfdist-run does not filter: TensorFlow's notices and library warnings.

In-process checks of `tfdist.process_setup.quiet_output`'s decisions; the multi-process
check (a job under mpirun prints no start-up notice and one copy of a Keras
warning) is `test_launchers.test_mpirun_output_is_as_quiet_as_tfdist_run`.
"""

import importlib
import importlib.util
import sys
import warnings

import pytest

from tfdist.process_setup import cluster, quiet_output
from tfdist.launch.output_filter import OutputFilter

MPI_RANK_1 = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}


@pytest.mark.parametrize("environ, modules, sets, hooks", [
    (MPI_RANK_1, {}, True, True),
    (dict(MPI_RANK_1, OMPI_COMM_WORLD_RANK="0"), {}, True, True),  # the chief's notices too
    (MPI_RANK_1, {"tensorflow": None}, False, False),              # too late: already imported
    (dict(MPI_RANK_1, TF_CPP_MIN_LOG_LEVEL="0"), {}, False, False),  # the user's choice
    (dict(MPI_RANK_1, TF_CPP_MIN_LOG_LEVEL="2"), {}, False, True),   # notices are info lines
    (dict(MPI_RANK_1, TFDIST_VERBOSE="1"), {}, False, False),
    ({"TFDIST_RANK": "1", "TFDIST_WORLD_SIZE": "2",
      "TFDIST_WORKER_ADDRESSES": "a:1,b:2"}, {}, False, False),    # tfdist-run filters itself
    ({}, {}, False, True),               # one process: notices held (printed twice there)
    ({"TF_CPP_MIN_LOG_LEVEL": "0"}, {}, False, False),               # one process, asked for
    ({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"}, {}, False, False),  # later
])
def test_tensorflow_notices_are_switched_off_only_where_nobody_filters(environ, modules, sets,
                                                                      hooks):
    before = dict(environ)
    environ, meta_path = dict(environ), []
    assert quiet_output.before_tensorflow(environ, modules, meta_path) is sets
    expected = dict(before, TF_CPP_MIN_LOG_LEVEL="1") if sets else before
    assert environ == expected  # nothing else touched; the user's own level kept
    assert [type(f) for f in meta_path] == ([quiet_output.NoticeFreeImport] if hooks else [])
    quiet_output.before_tensorflow(environ, modules, meta_path)
    assert len(meta_path) == (1 if hooks else 0)  # installed once


# The lines a TensorFlow 2.21 process prints at import on a CPU where oneDNN is on.
ONEDNN_NOTICES = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    "I0000 00:00:1795750750.298430    3981 port.cc:153] oneDNN custom operations are on. You "
    "may see slightly different numerical results due to floating-point round-off errors from "
    "different computation orders. To turn them off, set the environment variable "
    "`TF_ENABLE_ONEDNN_OPTS=0`.\n"
    "I0000 00:00:1795750701.465661    3816 cpu_feature_guard.cc:227] This TensorFlow binary is "
    "optimized to use available CPU instructions in performance-critical operations.\n"
    "To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 FMA, in other "
    "operations, rebuild TensorFlow with the appropriate compiler flags.\n")


def test_an_import_under_the_hook_prints_all_but_the_notices(tmp_path, capfd, monkeypatch):
    """C-level writes to file descriptor 2 during the import: notices go, the rest stays."""
    (tmp_path / "noisy_module.py").write_text(
        "import os, sys\n"
        f"os.write(2, {ONEDNN_NOTICES!r}.encode())\n"
        "os.write(2, b'a real error line\\n')\n"
        "print('a Python warning line', file=sys.stderr)\n"
        f"os.write(2, {ONEDNN_NOTICES!r}.encode())\n"
        "LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    meta_path = list(sys.meta_path)
    hook = quiet_output.NoticeFreeImport("noisy_module", meta_path)
    meta_path.insert(0, hook)
    monkeypatch.setattr(sys, "meta_path", meta_path)
    # a look-up that imports nothing (tfdist's check that TensorFlow is installed) keeps it
    assert importlib.util.find_spec("noisy_module") is not None and hook in sys.meta_path
    module = importlib.import_module("noisy_module")
    assert module.LOADED and hook not in sys.meta_path  # once
    assert module.__loader__.__class__.__name__ == "SourceFileLoader"
    err = capfd.readouterr().err  # (pytest captures sys.stderr apart from descriptor 2)
    assert sorted(err.splitlines()) == ["a Python warning line", "a real error line"], err


def test_tfdist_runs_filter_drops_notices_and_repeated_warnings():
    output_filter = OutputFilter()
    ranks = [output_filter.stream() for _ in range(2)]
    warning = ["/x/keras/layer.py:12: UserWarning: Do not pass an `input_shape`",
               "  super().__init__(**kwargs)"]
    printed = [[line for raw in ONEDNN_NOTICES.splitlines() + warning + ["rank output"]
                for line in keep(raw)] for keep in ranks]
    assert printed == [warning + ["rank output"], ["rank output"]]
    assert OutputFilter(enabled=False).stream()(ONEDNN_NOTICES.splitlines()[0]) != []


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
