"""The task of the large-batch experiment: a generated 10-class problem and an MLP.

The data come from scikit-learn's `make_classification` (no download):
70,000 examples (60,000 for training, 10,000 for validation) of 40 features,
10 classes of 4 Gaussian clusters each on the vertices of a hypercube in 12
informative dimensions, plus 2% flipped labels. An MLP needs many steps to
carve out the 40 clusters, so with a fixed number of epochs a larger batch
(fewer steps) hurts unless the learning rate makes up for it - the setting of
Goyal et al. (2017).
"""

import keras

TRAIN_ROWS, VALIDATION_ROWS = 60_000, 10_000
FEATURES, CLASSES = 40, 10


def make_data(seed=0):
    """(x_train, y_train), (x_val, y_val), float32 features standardised on the training set."""
    from sklearn.datasets import make_classification  # pylint: disable=import-outside-toplevel

    x, y = make_classification(
        n_samples=TRAIN_ROWS + VALIDATION_ROWS, n_features=FEATURES, n_informative=12,
        n_redundant=8, n_classes=CLASSES, n_clusters_per_class=4, class_sep=1.5, flip_y=0.02,
        random_state=seed)
    x = x.astype("float32")
    mean, std = x[:TRAIN_ROWS].mean(0), x[:TRAIN_ROWS].std(0)
    x = (x - mean) / std
    y = y.astype("int32")
    return (x[:TRAIN_ROWS], y[:TRAIN_ROWS]), (x[TRAIN_ROWS:], y[TRAIN_ROWS:])


def build_model(optimizer, seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(CLASSES),
    ])
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model
