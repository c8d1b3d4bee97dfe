"""Horovod's two Keras examples as Horovod users run them (tests/scripts/horovod_examples.py).

`tensorflow2_keras_mnist.py`'s shape - Dropout with no seed anywhere, so each rank draws its
own masks as in Horovod (a seed generator's state is each rank's own under per-rank input,
never a false divergence) - and `keras_imagenet_resnet50.py`'s resume - rank 0 alone
`hvd.load_model`s the newest checkpoint while the others build a fresh model - each with
only the documented changes (docs/horovod.md). make test runs both under plain tfdist-run
(the MPI engine); make test-all under horovodrun (Gloo) and mpirun too.
"""

import numpy as np
import pytest

from helpers import failure_report, require_launcher, run_job, script

pytestmark = pytest.mark.horovod


def _ranks(prefix, world=2):
    return [dict(np.load(f"{prefix}.rank{r}.npz")) for r in range(world)]


def _weights(results):
    return [results[k] for k in sorted(results) if k.startswith("weight_")]


def _same_weights(ranks):
    return max(float(np.max(np.abs(a - b)))
               for other in ranks[1:] for a, b in zip(_weights(ranks[0]), _weights(other)))


def _mnist(kind, tmp_path):
    prefix = str(tmp_path / "mnist")
    done = run_job(kind, 2, [script("horovod_examples.py"), "mnist", prefix], timeout=300,
                   run_timeout=120)
    assert done.returncode == 0, failure_report(done)
    ranks = _ranks(prefix)
    assert _same_weights(ranks) == 0.0  # every step's average, applied alike
    seeds = [[r[k].tolist() for k in sorted(r) if k.startswith("seed_")] for r in ranks]
    assert len(seeds[0]) == 2 and seeds[0] != seeds[1], seeds  # each rank its own masks
    assert np.all(np.isfinite(ranks[0]["loss"]))
    assert (tmp_path / "mnist-checkpoint-2.h5").exists()  # rank 0's checkpoints


def _resume(kind, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    for epochs, resumed in ((2, 0), (3, 2)):
        prefix = str(tmp_path / f"resume{epochs}")
        done = run_job(kind, 2, [script("horovod_examples.py"), "resume", prefix,
                                 str(checkpoints), str(epochs)], timeout=300, run_timeout=120)
        assert done.returncode == 0, failure_report(done)
        ranks = _ranks(prefix)
        assert [int(r["resumed_from"]) for r in ranks] == [resumed, resumed]
        assert _same_weights(ranks) == 0.0
        assert np.array_equal(ranks[0]["score"], ranks[1]["score"])
    keras = pytest.importorskip("keras")
    saved = keras.models.load_model(str(checkpoints / "checkpoint-2.keras")).get_weights()
    started = [ranks[0][f"started_{i}"] for i in range(len(saved))]  # rank 0 restored it
    assert all(np.array_equal(a, b) for a, b in zip(saved, started))
    assert sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith(".")) == [
        f"checkpoint-{e}.keras" for e in (1, 2, 3)]


def test_the_mnist_example_without_a_seed_under_tfdist_run(tmp_path):
    _mnist("tfdist-run", tmp_path)


def test_the_resnet50_examples_rank_zero_resume_under_tfdist_run(tmp_path):
    _resume("tfdist-run", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["horovodrun", "mpirun"])
def test_both_examples_under_horovods_launchers(kind, tmp_path):
    require_launcher(kind)
    (tmp_path / "mnist").mkdir()
    (tmp_path / "resume").mkdir()
    _mnist(kind, tmp_path / "mnist")
    _resume(kind, tmp_path / "resume")
