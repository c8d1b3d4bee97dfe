"""tfdist's quick start: a Keras model trained on N processes exactly as on one.

    tfdist-run -np 2 python quickstart.py   # 2 processes on this machine
    python quickstart.py                    # 1 process: the same numbers
"""
import tfdist  # first: TensorFlow's start-up notices stay out of the output
import keras
import numpy as np

# 1,000 rows, 20 features, 3 classes; any NumPy arrays or tf.data pipeline will do.
rng = np.random.default_rng(0)
x = rng.normal(size=(1000, 20)).astype("float32")
y = x[:, :3].argmax(axis=1).astype("int32")

keras.utils.set_random_seed(0)  # the same initial weights as a one-process run
strategy = tfdist.strategies.RingAllReduceStrategy()  # the one line a Keras script adds
with strategy.scope():  # build and compile the model inside the scope
    model = keras.Sequential([
        keras.Input((20,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(3, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])

# batch_size is the global batch: 64 rows per step, split across the processes.
model.fit(x, y, batch_size=64, epochs=3, validation_split=0.2, verbose=2)
model.save("quickstart.keras")  # every rank calls it; rank 0 writes the file
