"""What issue 48's guarantees cost (one process, no launcher): eager lineage and weight checks.

Usage: python -m experiments.consistency_costs [OUT.json]

* **Eager lineage** (`tfdist.strategies.step.batch_dependence`): an eager step
  (`run_eagerly=True`, keras.io's text classifier: Embedding -> mean pooling
  -> Dense, Adam, batches of 64 sequences of 16 tokens) runs with
  `BatchLineage.recording()` around it, or without, in interleaved rounds;
  the ratio of median step times is the op callbacks' cost. Traced steps pay
  nothing per step (one graph walk per trace).
* **Weight fingerprints** (`tfdist.strategies.state.replica_consistency`): hashing
  the 5.8 M-parameter MLP of the engine benchmarks and its Adam state, what a
  rank does once per epoch, at the end of `fit` and at each save; against
  the MLP's own traced step on one process, so the per-epoch cost reads as a
  number of steps.
* **Step payload**: the fingerprints ride the step's fused all-reduce as 2 P
  floats (8 P bytes), against the MLP's 23 MB of gradients.
"""

import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfdist.strategies.state import replica_consistency  # noqa: E402
from tfdist.strategies.step.batch_dependence import BatchLineage  # noqa: E402

ROUNDS, STEPS = 5, 20
HERE = os.path.dirname(os.path.abspath(__file__))


def text_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,), dtype="int32"), keras.layers.Embedding(5000, 64),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def eager_step_seconds(model, batches, lineage):
    """Median seconds of an eager `train_step`, with the lineage recorded or not."""
    times = []
    for x, y in batches:
        start = time.perf_counter()
        if lineage:
            with BatchLineage((x, y)).recording():
                model.train_step((x, y))
        else:
            model.train_step((x, y))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def eager_lineage():
    rng = np.random.default_rng(0)
    model = text_model()
    batches = [(tf.constant(rng.integers(0, 5000, (64, 16)), tf.int32),
                tf.constant(rng.random((64, 1)), tf.float32)) for _ in range(STEPS)]
    eager_step_seconds(model, batches[:3], False)  # builds the optimizer, warms up
    rounds = []
    for _ in range(ROUNDS):  # interleaved: the machine's load moves both alike
        rounds.append({"without_ms": 1e3 * eager_step_seconds(model, batches, False),
                       "with_ms": 1e3 * eager_step_seconds(model, batches, True)})
    ratio = statistics.median(r["with_ms"] / r["without_ms"] for r in rounds)
    return {"rounds": rounds, "with_over_without": ratio}


def fingerprints():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((784,))] + [keras.layers.Dense(2048, activation="relu")
                                                       for _ in range(2)]
                             + [keras.layers.Dense(10)])
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).random((64, 784)).astype("float32")
    y = np.zeros((64, 10), "float32")
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)  # builds Adam's slots
    variables = replica_consistency.compared_variables(model)
    step = model.make_train_function()
    iterator = iter(tf.data.Dataset.from_tensors((x, y)).repeat())
    hashes, steps = [], []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        replica_consistency.whole_fingerprint(replica_consistency.variable_fingerprints(variables))
        hashes.append(time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(5):
            step(iterator)
        steps.append((time.perf_counter() - start) / 5)
    parameters = sum(int(np.prod(w.shape)) for w in model.weights)
    hashed_bytes = sum(int(np.prod(v.shape)) * v.dtype.itemsize if hasattr(v.dtype, "itemsize")
                       else int(np.prod(v.shape)) * 4 for v in variables)
    return {"parameters": parameters, "hashed_bytes": hashed_bytes,
            "hash_ms": 1e3 * statistics.median(hashes),
            "traced_step_ms": 1e3 * statistics.median(steps),
            "hash_in_steps": statistics.median(hashes) / statistics.median(steps),
            "step_payload_bytes_added_per_process": 8,
            "gradient_bytes": 4 * parameters}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    out = argv[0] if argv else os.path.join(HERE, "results", "consistency_costs.json")
    result = {"environment": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                              "cpus": os.cpu_count(), "tensorflow": tf.__version__,
                              "keras": keras.__version__},
              "eager_lineage": eager_lineage(), "fingerprints": fingerprints()}
    result["summary"] = {
        "eager_step_with_lineage_over_without": round(
            result["eager_lineage"]["with_over_without"], 2),
        "fingerprint_ms_per_epoch_5_8M_mlp_adam": round(result["fingerprints"]["hash_ms"], 1),
        "fingerprint_in_traced_steps": round(result["fingerprints"]["hash_in_steps"], 2),
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result["summary"]))
    return result


if __name__ == "__main__":
    main()
