"""`tfdist-bench --only anchor`: tfdist's `fit` step against a hand-written Horovod/TF loop.

`anchor_step.py` on 2 processes, once per engine (TF collectives, Horovod):
in the same processes and interleaved round by round, Keras' `fit` under
`RingAllReduceStrategy` and a `tf.function` training loop written directly
on the engine (one fused all-reduce of the gradients per step), same model,
per-process batch and optimizer. Result: benchmarks/results/anchor.json
(`fit_over_anchor` per engine; the goal is within 5%).
"""

import json
import os

from benchmarks.harness import launch, write_result

ENGINES = {"collective": [], "horovod": ["--horovod"]}


def run(tmp):
    runs = {}
    for engine, flags in ENGINES.items():
        out = os.path.join(tmp, f"anchor_{engine}.json")
        launch(2, "anchor_step.py", [out, engine], flags=flags)
        with open(out) as f:
            runs[engine] = json.load(f)
    result = {
        "summary": {f"{engine}_fit_over_anchor": round(r["fit_over_anchor"], 3)
                    for engine, r in runs.items()},
        "runs": runs,
        "description": "median step of Keras' fit under RingAllReduceStrategy (default "
                       "buckets) over the median step of a hand-written tf.function loop "
                       "(GradientTape, one hvd.grouped_allreduce or one CollectiveReduceV2 of "
                       "the concatenated gradients, optimizer.apply), same 19 MB model "
                       "(overlap_step.py), per-process batch 64, one intra-op thread, 2 "
                       "processes, interleaved in the same processes (first round discarded).",
    }
    write_result("anchor.json", result)
    return result
