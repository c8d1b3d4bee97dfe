"""Lossy compression inside Keras' fit on real processes (the numerics: test_aggregators_in_process).

Top-k with error feedback: with every entry sent it trains exactly as without
compression; with 5% of the entries it still trains, every rank holding the
same weights while each keeps its own residual.
"""

import numpy as np

from helpers import failure_report, script, tfdist_run


def test_topk_in_fit_is_exact_at_ratio_one_and_keeps_ranks_identical(tmp_path):
    done = tfdist_run(2, [script("topk_training.py"), str(tmp_path)], timeout=400)
    assert done.returncode == 0, failure_report(done)
    assert "compression topk" in done.stdout
    ranks = [np.load(tmp_path / f"topk.rank{r}.npz") for r in range(2)]
    np.testing.assert_allclose(ranks[0]["full"], ranks[0]["plain"], atol=1e-6)
    np.testing.assert_allclose(ranks[0]["full_loss"], ranks[0]["plain_loss"], rtol=1e-6)
    for run in ("plain", "full", "sparse"):
        np.testing.assert_array_equal(ranks[1][run], ranks[0][run])  # identical weights
    sparse_loss = ranks[0]["sparse_loss"]
    assert sparse_loss[-1] < 0.5 * sparse_loss[0], sparse_loss  # 5% of the entries still train
    assert not np.array_equal(ranks[0]["sparse"], ranks[0]["plain"])  # and it is lossy
    # Each rank keeps its own residual (its compression error), never averaged.
    assert np.count_nonzero(ranks[0]["residuals"]) > 0
    assert not np.allclose(ranks[0]["residuals"], ranks[1]["residuals"])
