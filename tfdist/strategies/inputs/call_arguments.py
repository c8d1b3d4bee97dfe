"""The arguments of `fit` / `evaluate` / `predict` that every rank must pass alike.

tfdist splits every global batch across ranks, so `batch_size` is the global
batch and must be the same on every rank: ranks given 32 and 34 with the same
number of batches would each take their slice of a different global batch
and train silently on the wrong rows. The same holds for every argument that
decides which rows form a batch or how many steps and epochs run.
`call_signature` turns a call's arguments into integers (None as -1, a
flag as 0/1, anything else as a 63-bit hash of its `repr`), which the epoch
iterator's check compares across ranks with the data's own fingerprint in
one all-gather (`same_data_check`), naming the argument
and each rank's value when they differ.

Cost: a hash per argument, once per call.
"""

import hashlib

# The callbacks that save the optimizer state, where the optimizer-state mode compares them
# (`Placement.state_savers`: a sharded state needs every rank's slices in the file).
STATE_SAVERS = "checkpoint callbacks of a sharded optimizer state"

# The call each epoch iterator belongs to, and the arguments compared (the order is fixed).
CALLS = ("fit", "evaluate", "predict")
ARGUMENTS = ("batch_size", "steps", "shuffle", "class_weight", "sample_weight",
             "steps_per_execution", "epochs", "initial_epoch", "validation_split",
             "validation_freq", "validation_batch_size", "validation_steps",
             STATE_SAVERS)


def _as_integer(value):
    if value is None:
        return -1
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, dict):
        value = sorted(value.items(), key=repr)
    digest = hashlib.blake2b(repr(value).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def call_signature(call, arguments):
    """[index of `call` in CALLS] + one integer per name of ARGUMENTS (-1 when not given).

    `arguments`: the call's arguments by name (`steps_per_epoch` counts as
    `steps`; `sample_weight` only as given or not: the arrays are in the
    data's fingerprint).
    """
    arguments = dict(arguments)
    if "steps_per_epoch" in arguments:
        arguments["steps"] = arguments.pop("steps_per_epoch")
    arguments["sample_weight"] = arguments.get("sample_weight") is not None
    return [CALLS.index(call)] + [_as_integer(arguments.get(name)) for name in ARGUMENTS]


def describe(value):
    """A signature integer as a user would read it (hashes are not shown as numbers)."""
    if value == -1:
        return "None"
    return str(value) if abs(value) < 2 ** 31 else "<another value>"


def first_difference(signatures):
    """(argument name or "call", [value by rank]) of the first entry that differs, or None."""
    for position in range(len(signatures[0])):
        values = [signature[position] for signature in signatures]
        if len(set(values)) > 1:
            if position == 0:
                return "call", [CALLS[v] if 0 <= v < len(CALLS) else "?" for v in values]
            return ARGUMENTS[position - 1], [describe(v) for v in values]
    return None
