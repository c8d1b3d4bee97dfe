"""Gradient compression: pass one of these as a strategy's `compression=`.

    strategy = tfdist.strategies.RingAllReduceStrategy(
        compression=tfdist.compression.PowerSGD(rank=2))

`FP16()` halves the bytes of every algorithm's sum (the parameter server's
too); `PowerSGD(rank=...)` sends each gradient matrix as two rank-r factors
(ring and tree); `TopK(ratio=...)` sends each rank's largest entries and
`SignSGD()` one bit per entry and a scale per tensor (ring only: their
messages are gathered, not summed). The three lossy ones keep each rank's
compression error (error feedback) as optimizer variables: saved and
restored with the optimizer. Names work too: "fp16", "powersgd", "topk",
"signsgd" (each with its defaults). Each class's module docstring states
its algorithm, wire bytes, cost model and guarantee. Which to use, and
whether any pays on a given network: `tfdist.aggregation.recommend`, and the
docs/compression.md (measured: on a fast network none does).
"""

from tfdist import versions as _versions

_versions.require_tensorflow()  # missing: an error that names the install extra

from tfdist.aggregation.compression import Compressor
from tfdist.aggregation.compression import FP16Compression as FP16
from tfdist.aggregation.powersgd import PowerSGD
from tfdist.aggregation.signsgd import SignSGD
from tfdist.aggregation.topk import TopK

__all__ = ["Compressor", "FP16", "PowerSGD", "SignSGD", "TopK"]
