"""Which rank owns which elements of the model's parameters: the plan of optimizer-state sharding.

ZeRO stage 1 (Rajbhandari et al., 2020) and PyTorch's `ZeroRedundancyOptimizer`
give each of P ranks the optimizer state of 1/P of the parameters. torch
partitions whole parameters (sorted greedy), which leaves a model dominated by
one matrix unbalanced (the 784-2048-2048-10 MLP: one kernel is 72 % of its
elements); DeepSpeed flattens the parameters and cuts the flat buffer into P
equal ranges. `FlatPartition` does the latter: the variables of one dtype,
flattened in the optimizer's order, form one buffer of N elements, cut into P
contiguous ranges of ceil(N / P) elements (the last rank's holds the rest, fewer
by at most P - 1), rank r owning range r: the ranges padded to equal size and
concatenated are the buffer followed by its padding, so the parameters'
all-gather needs no copy to strip the padding (`ceiling_ranges`). A variable is thus owned whole by one rank or split between
consecutive ranks; each rank's part of a variable is one contiguous slice of
its flattened elements, so an element-wise update of the slice equals the
update of those elements in the whole variable.

Guarantee: the ranges cover every element exactly once, in rank order, so the
ranks' slices of a variable concatenated in rank order are the variable's
flattened elements. Cost: none at run time (computed once when the optimizer is
built, from static shapes).
"""

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

from tfdist.aggregation.fusion import reverse_order_buckets


@dataclasses.dataclass(frozen=True)
class Slice:
    """Rank `rank`'s part of variable `index`: flattened elements [start, stop)."""

    index: int
    rank: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def ceiling_ranges(total: int, world_size: int) -> List[int]:
    """P range sizes that cover `total` elements: ceil(total / P) for every rank while elements
    last, the rest (possibly 0) after. So the ranks' ranges, each padded to the first's size
    and concatenated in rank order, hold the buffer's elements at its start: a gather of
    equal-size pieces is the buffer without any copy to strip the padding."""
    width = -(-total // world_size) if total else 0
    ranges = []
    left = total
    for _ in range(world_size):
        ranges.append(min(width, left))
        left -= ranges[-1]
    return ranges


def bucket_groups(sizes: Sequence[int], dtype_names: Sequence[str], item_bytes: Sequence[int],
                  bucket_bytes: int, first_bucket_bytes: Optional[int] = None) -> List[str]:
    """Each variable's group when gradients are reduce-scattered bucket by bucket: the
    gradient buckets of the ring (`fusion.reverse_order_buckets` over the variables' bytes,
    last variable first) split by dtype, named "<dtype>/<bucket>".

    A group is partitioned on its own (`FlatPartition`), so rank r's range of a group is
    the r-th of P equal chunks of that bucket's flat buffer (padded to P x ceil(N / P)):
    exactly what a reduce-scatter of the buffer delivers to rank r, and each bucket's
    reduce-scatter can start as soon as its gradients exist. A variable still lies in one
    group, so each rank's part of it stays one contiguous slice.
    """
    buckets = reverse_order_buckets([int(n) * int(b) for n, b in zip(sizes, item_bytes)],
                                    bucket_bytes, first_bucket_bytes)
    groups = [""] * len(sizes)
    for number, positions in enumerate(buckets):
        for position in positions:
            groups[position] = f"{dtype_names[position]}/{number}"
    return groups


class FlatPartition:
    """The element ranges of P ranks over variables grouped by dtype; see the module docstring.

    Args:
        sizes: the number of elements of each variable, in the optimizer's order.
        groups: each variable's group (its dtype's name): variables of one
            group form one flat buffer, partitioned on its own.
        world_size: P.
    """

    def __init__(self, sizes: Sequence[int], groups: Sequence[str], world_size: int):
        if len(sizes) != len(groups):
            raise ValueError(f"one group per variable: {len(sizes)} sizes, {len(groups)} groups")
        self.world_size = int(world_size)
        self.sizes = [int(s) for s in sizes]
        self.groups = list(groups)
        self._slices: List[List[Slice]] = [[] for _ in sizes]  # per variable, in rank order
        self.group_sizes: Dict[str, List[int]] = {}  # group -> elements each rank owns
        for group in dict.fromkeys(groups):
            members = [i for i, g in enumerate(groups) if g == group]
            total = sum(self.sizes[i] for i in members)
            self.group_sizes[group] = ranges = ceiling_ranges(total, self.world_size)
            bounds = [0]
            for size in ranges:
                bounds.append(bounds[-1] + size)
            offset = 0
            for i in members:
                begin, end = offset, offset + self.sizes[i]
                for rank in range(self.world_size):
                    low, high = max(begin, bounds[rank]), min(end, bounds[rank + 1])
                    if low < high or (self.sizes[i] == 0 and rank == 0):
                        self._slices[i].append(Slice(i, rank, low - begin, max(low, high) - begin))
                offset = end

    def slices_of(self, index: int) -> List[Slice]:
        """The slices of variable `index`, in rank order (together: all its elements)."""
        return list(self._slices[index])

    def slice_of(self, index: int, rank: int) -> Tuple[int, int]:
        """(start, stop) of rank `rank`'s part of variable `index` ((0, 0): none)."""
        for piece in self._slices[index]:
            if piece.rank == rank:
                return piece.start, piece.stop
        return 0, 0

    def owned_elements(self, rank: int) -> int:
        """Elements rank `rank` owns over every group."""
        return sum(sizes[rank] for sizes in self.group_sizes.values())

    def describe(self) -> str:
        total = sum(self.sizes)
        parts = ", ".join(f"rank {r}: {self.owned_elements(r)}" for r in range(self.world_size))
        return f"{total} elements of {len(self.sizes)} variables ({parts})"
