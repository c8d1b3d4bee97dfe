"""Fit the alpha-beta cost model to measured all-reduce times.

Every algorithm's predicted time is linear in (alpha, beta):
T = alpha * A + beta * B, with A = predict(alpha=1, beta=0) and
B = predict(alpha=0, beta=1) from `tfdist.aggregation.cost_model`. The fit
is a least-squares solve on relative error (each row divided by its
measured time), so 4 KiB and 64 MiB payloads weigh alike.
"""

import numpy as np

from tfdist.aggregation.cost_model import predict_all_reduce_seconds


def model_terms(algorithm, n_bytes, world_size, **options):
    """(A, B): the model's latency and bandwidth coefficients for one all-reduce."""
    return (predict_all_reduce_seconds(algorithm, n_bytes, world_size, 1.0, 0.0, **options),
            predict_all_reduce_seconds(algorithm, n_bytes, world_size, 0.0, 1.0, **options))


def fit_alpha_beta(samples):
    """Least-squares (alpha, beta) for samples of (algorithm, n_bytes, P, options, seconds)."""
    rows, targets = [], []
    for algorithm, n_bytes, world, options, seconds in samples:
        a, b = model_terms(algorithm, n_bytes, world, **options)
        rows.append([a / seconds, b / seconds])
        targets.append(1.0)
    (alpha, beta), *_ = np.linalg.lstsq(np.array(rows), np.array(targets), rcond=None)
    return float(alpha), float(beta)


def relative_errors(samples, alpha, beta):
    """(predicted - measured) / measured for each sample."""
    return [(predict_all_reduce_seconds(algorithm, n, world, alpha, beta, **options) - seconds)
            / seconds for algorithm, n, world, options, seconds in samples]


def error_summary(errors):
    magnitudes = sorted(abs(e) for e in errors)
    return {"median_abs_relative_error": float(np.median(magnitudes)),
            "max_abs_relative_error": magnitudes[-1], "samples": len(magnitudes)}
