"""Where one variable lives: the `Layout` a strategy's `Placement` answers for every variable.

Keras 3's distribution API asks a `LayoutMap` for each variable's `TensorLayout` (which mesh
axis cuts which of its axes) when the variable is created; FSDP answers the same for a whole
module with one `ShardingStrategy` value. A data-parallel job needs three answers:

* `WHOLE`  every rank holds the whole variable, equal on every rank (the weights unsharded,
           moving statistics, counters, scalars);
* `SLICE`  this rank stores elements [start, stop) of the flattened whole (ceil(N/P) each):
           an optimizer slot with `sharding="optimizer"` / `"gradients"`, a trainable
           parameter and its slots with `"parameters"`; what Keras, the files and the user
           see is still the whole shape (`shape`);
* `OWN`    the rank's own value, never compared or averaged (a compressor's error-feedback
           residual, `rank_state`).

The placement decides a variable's layout where the variable is created
(`Placement.create`) and answers `Placement.layout` from then on; the consistency check and
the backup take a rank's sliced state from it (`sliced`).

Cost: a dictionary lookup per variable asked.
"""

import dataclasses
from typing import Optional, Tuple

WHOLE = "whole"
SLICE = "slice"
OWN = "own"


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a variable lives on this rank.

    Attributes:
        kind: `WHOLE`, `SLICE` or `OWN`.
        shape: the whole variable's shape (what Keras, saved files and the user see).
        start, stop: with `SLICE`, the elements of the flattened whole this rank stores.
    """
    kind: str
    shape: Tuple[int, ...]
    start: int = 0
    stop: Optional[int] = None

    @property
    def stored_elements(self) -> int:
        """How many elements this rank stores."""
        if self.kind == SLICE:
            return (self.stop or 0) - self.start
        elements = 1
        for size in self.shape:
            elements *= int(size)
        return elements


def _shape(variable) -> Tuple[int, ...]:
    return tuple(int(size) for size in variable.shape)


def whole_or_own(variable) -> Layout:
    """A variable no sharding placed: the rank's own (`rank_state`), else whole."""
    from tfdist.strategies.state import rank_state

    kind = OWN if rank_state.is_rank_own(variable) else WHOLE
    return Layout(kind, _shape(variable))


def sliced_layout(shape, start: int, stop: int) -> Layout:
    """Elements [start, stop) of a whole of `shape`."""
    return Layout(SLICE, tuple(int(size) for size in shape), int(start), int(stop))


def sliced(model, placement) -> list:
    """The variables of `model`'s optimizer (and of the one it wraps) that `placement` lays
    out as this rank's slice: not compared across ranks, backed up per rank."""
    found, optimizer = [], getattr(model, "optimizer", None)
    while optimizer is not None:
        if getattr(optimizer, "built", False):
            found += [v for v in optimizer.variables if placement.layout(v).kind == SLICE]
        optimizer = getattr(optimizer, "inner_optimizer", None)
    unique = {id(v): v for v in found}
    return list(unique.values())
