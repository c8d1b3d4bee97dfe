"""Worker script: what a user's plain script prints under a launcher that does not filter.

    python quiet_job.py

Imports tfdist before Keras (as tfdist.process_setup.quiet_output advises), raises one warning
of its own and triggers one of Keras' (a layer given `input_shape`), then
trains a few steps. Every rank runs it; the test counts the lines.
"""

import warnings

import tfdist
import keras
import numpy as np

strategy = tfdist.strategies.RingAllReduceStrategy()
warnings.warn("quiet_job: a warning of the user's own")
with strategy.scope():
    model = keras.Sequential([keras.layers.Dense(4, input_shape=(3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
x = np.ones((16, 3), "float32")
model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0)
print(f"quiet_job rank {strategy.cluster_resolver.task_id} done", flush=True)
