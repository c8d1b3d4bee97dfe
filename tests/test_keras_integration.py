"""Keras features under tfdist on 2 processes: chief-only output, local state, resume."""

import os

import numpy as np
import pytest

from helpers import failure_report, script, tfdist_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("keras")
    out = str(workdir / "out")
    result = tfdist_run(2, [script("keras_integration.py"), out, str(workdir)], timeout=300)
    assert result.returncode == 0, failure_report(result)
    return workdir, out, result


def load(path):
    data = np.load(path)
    return {k: data[k] for k in data.files}


def test_only_the_chief_prints_progress(run):
    _, _, result = run
    lines = result.stdout.split("\n")  # not splitlines(): the bar redraws with "\r"
    assert any(l.startswith("[0]") and "step" in l for l in lines)
    assert not any(l.startswith("[1]") and "step" in l for l in lines)


def test_chief_writes_checkpoints_and_logs_and_save_works_on_every_rank(run):
    workdir, _, _ = run
    for name in ("ckpt", "final"):
        assert os.path.getsize(workdir / f"{name}.rank0.keras") > 0
        assert not os.path.exists(workdir / f"{name}.rank1.keras"), f"rank 1 wrote {name}"
    with open(workdir / "log.rank0.csv") as f:
        assert len(f.read().strip().splitlines()) == 3  # header + 2 epochs
    assert not os.path.exists(workdir / "log.rank1.csv"), "rank 1 wrote a CSV log"
    assert not [n for n in os.listdir(workdir) if ".tmp" in n]  # atomic saves cleaned up


def test_batchnorm_statistics_and_weights_agree_across_ranks(run):
    _, out, _ = run
    rank0, rank1 = load(f"{out}.rank0.npz"), load(f"{out}.rank1.npz")
    assert len(rank0) == 9  # Dense(2) + BN(4: gamma, beta, moving mean, var) + Dense(2) + loss
    for key in rank0:
        np.testing.assert_allclose(rank0[key], rank1[key], atol=1e-6)


def test_backup_and_restore_resumes_on_every_rank(run):
    _, out, _ = run
    rank0, rank1 = load(f"{out}.resumed.rank0.npz"), load(f"{out}.resumed.rank1.npz")
    assert int(rank0["epochs_run"]) == 2 and int(rank1["epochs_run"]) == 2
    for key in rank0:
        np.testing.assert_allclose(rank0[key], rank1[key], atol=1e-6)


def test_jit_compiled_model_trains_and_ranks_agree(run):
    _, out, _ = run
    rank0, rank1 = load(f"{out}.jit.rank0.npz"), load(f"{out}.jit.rank1.npz")
    # 240 steps of 10 epochs: thread count must not grow with the number of collectives.
    assert rank0.pop("threads_added") < 40 and rank1.pop("threads_added") < 40
    for key in rank0:
        np.testing.assert_allclose(rank0[key], rank1[key], atol=1e-6)
