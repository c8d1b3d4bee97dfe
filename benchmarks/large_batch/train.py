"""Worker: one training run of the large-batch experiment.

Usage: python -m benchmarks.large_batch.train OUT --batch N --method base|linear|warmup|lars
Runs under a tfdist strategy (RingAllReduceStrategy), so the same command
trains in one process or, launched by tfdist-run, across processes with the
same global batch. The chief writes OUT (JSON): the per-epoch history
(validation accuracy, loss, learning rate) and the wall time.
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

import tfdist  # noqa: E402
from benchmarks.large_batch.task import build_model, make_data  # noqa: E402

METHODS = ("base", "linear", "warmup", "lars")


def recipe(method, base_batch, sgd_lr, lars_lr, warmup_epochs):
    """(optimizer, callbacks) of one method; base rates are those tuned at batch `base_batch`."""
    c = tfdist.callbacks
    if method == "base":
        return keras.optimizers.SGD(sgd_lr, momentum=0.9), []
    if method == "linear":
        return keras.optimizers.SGD(sgd_lr, momentum=0.9), [c.LearningRateScaling(sgd_lr, base_batch)]
    lr = lars_lr if method == "lars" else sgd_lr
    optimizer = (tfdist.optimizers.LARS(lr, momentum=0.9) if method == "lars"
                 else keras.optimizers.SGD(lr, momentum=0.9))
    # Goyal et al.: ramp from the small-batch rate to the scaled one.
    return optimizer, [c.LearningRateScaling(lr, base_batch),
                       c.LearningRateWarmup(warmup_epochs, initial_lr=lr)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--method", choices=METHODS, required=True)
    parser.add_argument("--base-batch", type=int, default=32)
    parser.add_argument("--sgd-lr", type=float, default=0.01)
    parser.add_argument("--lars-lr", type=float, default=0.3)
    parser.add_argument("--warmup-epochs", type=float, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    strategy = tfdist.strategies.RingAllReduceStrategy()
    (x, y), validation = make_data()
    with strategy.scope():
        optimizer, callbacks = recipe(args.method, args.base_batch, args.sgd_lr, args.lars_lr,
                                      args.warmup_epochs)
        model = build_model(optimizer, args.seed)
    start = time.perf_counter()
    history = model.fit(x, y, batch_size=args.batch, epochs=args.epochs, validation_data=validation,
                        callbacks=callbacks, verbose=0)
    seconds = time.perf_counter() - start
    if "learning_rate" not in history.history:
        history.history["learning_rate"] = [float(optimizer.learning_rate.numpy())] * args.epochs
    if strategy.is_chief:
        with open(args.out, "w") as f:
            json.dump({"batch": args.batch, "method": args.method, "processes": strategy.world_size,
                       "seed": args.seed, "seconds": seconds,
                       "history": {k: [float(v) for v in vs] for k, vs in history.history.items()}},
                      f)


if __name__ == "__main__":
    main()
