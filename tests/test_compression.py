"""Lossy compression inside Keras' fit on real processes (the numerics: test_aggregators_in_process).

The same script with every compressor of `tfdist.compression` on 2
processes: the lossless settings (top-k with every entry, PowerSGD at full
rank) train exactly as without compression; PowerSGD rank 2, top-k 1%,
top-k with momentum correction and 1-bit still train, every rank holding
the same weights while each keeps its own residual, and
`CommunicationMonitor` reports the fewer bytes they send.
"""

import numpy as np
import pytest

from helpers import failure_report, horovodrun, script, tfdist_run

LOSSY = ("powersgd", "powersgd_warmup", "topk", "topk_momentum", "signsgd")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("compressed")
    done = tfdist_run(2, [script("compressed_training.py"), str(out)], timeout=600)
    assert done.returncode == 0, failure_report(done)
    assert "compression powersgd" in done.stdout
    return [np.load(out / f"compressed.rank{r}.npz") for r in range(2)]


def test_lossless_settings_train_exactly_as_uncompressed(ranks):
    for name in ("topk_full", "powersgd_full"):
        np.testing.assert_allclose(ranks[0][f"{name}_weights"], ranks[0]["plain_weights"],
                                   atol=2e-5, err_msg=name)
        np.testing.assert_allclose(ranks[0][f"{name}_loss"], ranks[0]["plain_loss"],
                                   rtol=1e-4, err_msg=name)


# Final loss at most this times the uncompressed run's (measured: 1.05, 2.9, 1.3, 1.2, 1.0).
# Top-k 1% with the optimizer's momentum lags most in 48 steps, as Deep Gradient Compression
# reports without its momentum correction; with it (top-k 5% here) it keeps up.
FINAL_LOSS_WITHIN = {"powersgd": 1.2, "powersgd_warmup": 1.3, "topk": 4.0, "topk_momentum": 1.5, "signsgd": 1.5,
                     "fp16": 1.01}


@pytest.mark.parametrize("name", LOSSY + ("fp16",))
def test_every_compressor_trains_with_identical_weights_on_every_rank(ranks, name):
    np.testing.assert_array_equal(ranks[1][f"{name}_weights"], ranks[0][f"{name}_weights"])
    loss, plain = ranks[0][f"{name}_loss"], ranks[0]["plain_loss"]
    assert loss[-1] < 0.6 * loss[0], (name, loss)  # it trains
    assert loss[-1] < FINAL_LOSS_WITHIN[name] * plain[-1], (name, loss, plain)
    if name in LOSSY:
        assert not np.array_equal(ranks[0][f"{name}_weights"], ranks[0]["plain_weights"])
        # Each rank keeps its own residual (its compression error), never averaged.
        residuals = [r[f"{name}_residuals"] for r in ranks]
        assert np.count_nonzero(residuals[0]) > 0
        assert not np.allclose(residuals[0], residuals[1])


def test_powersgd_sums_exactly_until_its_start_step(ranks):
    """16 exact steps (the first two epochs) as the uncompressed run, then rank 1 factors."""
    warmup, plain = ranks[0]["powersgd_warmup_loss"], ranks[0]["plain_loss"]
    np.testing.assert_allclose(warmup[:2], plain[:2], rtol=1e-5)
    assert not np.allclose(warmup[2:], plain[2:], rtol=1e-4)
    sent = ranks[0]["powersgd_warmup_sent_mb"]
    assert sent[3] < 0.5 * sent[0], sent  # compressed from the third epoch


@pytest.mark.parametrize("name,most", [("powersgd", 0.35), ("topk", 0.1), ("topk_momentum", 0.3),
                                        ("signsgd", 0.1), ("fp16", 0.55)])
def test_the_monitor_reports_the_compressed_bytes_sent(ranks, name, most):
    plain = ranks[0]["plain_sent_mb"]
    sent = ranks[0][f"{name}_sent_mb"]
    assert np.all(plain > 0) and np.all(sent > 0), (plain, sent)
    assert np.all(sent < most * plain), (name, sent / plain)


@pytest.mark.slow  # make test-all (make test stays within 20 min: tests/tiers.py)
def test_the_compressors_run_on_horovod_as_on_tensorflow_collectives(ranks, tmp_path):
    """The same script under horovodrun (Gloo): the same losses as on TF collectives (the
    engines sum in different orders: float tolerance), identical weights on both ranks."""
    names = ("plain", "powersgd", "topk", "signsgd")
    done = horovodrun(2, [script("compressed_training.py"), str(tmp_path), ",".join(names)])
    assert done.returncode == 0, failure_report(done)
    assert "aggregator ring on horovod-gloo, compression signsgd" in done.stdout + done.stderr
    horovod = [np.load(tmp_path / f"compressed.rank{r}.npz") for r in range(2)]
    for name in names:
        np.testing.assert_array_equal(horovod[1][f"{name}_weights"], horovod[0][f"{name}_weights"])
        np.testing.assert_allclose(horovod[0][f"{name}_loss"], ranks[0][f"{name}_loss"],
                                   rtol=1e-4, err_msg=name)
        np.testing.assert_allclose(horovod[0][f"{name}_sent_mb"], ranks[0][f"{name}_sent_mb"],
                                   rtol=0.05, err_msg=name)
