"""The large-batch experiment: batch B, 8B and 32B with base rate, linear scaling,
linear scaling + warmup, and LARS (`python -m benchmarks.large_batch`)."""

from benchmarks.large_batch.experiment import run

__all__ = ["run"]
