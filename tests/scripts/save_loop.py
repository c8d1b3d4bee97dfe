"""Save a model over and over until killed (for the torn-checkpoint test).

    python save_loop.py DIR [--plain]

Under a tfdist strategy (one process) the model (about 8 MB of weights) is
saved as DIR/model.keras and DIR/model.weights.h5, its weights changed between
saves, and "saved N" printed after each pair. --plain: no strategy (Keras'
own in-place writes, to show what the test guards against).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402


def main():
    directory = sys.argv[1]
    plain = "--plain" in sys.argv[2:]
    scope = (tfdist.strategies.RingAllReduceStrategy().scope() if not plain
             else keras.name_scope("plain"))
    with scope:
        model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(1024),
                                  keras.layers.Dense(1024)])
        model.compile(optimizer="adam", loss="mse")
    for count in range(1, 10_000):
        model.set_weights([np.full(w.shape, count, w.dtype) for w in model.get_weights()])
        model.save(os.path.join(directory, "model.keras"))
        model.save_weights(os.path.join(directory, "model.weights.h5"))
        print(f"saved {count}", flush=True)


if __name__ == "__main__":
    main()
