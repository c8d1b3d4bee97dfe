"""Draw the documentation's diagrams into docs/images/ (matplotlib; run after changing one).

    .venv/bin/python scripts/docs_diagrams.py                 # every diagram
    .venv/bin/python scripts/docs_diagrams.py architecture    # only the ones named

Each picture shows one algorithm or structure the pages describe in words: the ring
all-reduce, the reduction tree, parameter servers (synchronous and asynchronous), the elastic
resize, optimizer-state sharding's partition, and the package's layers with the strategy's
three mode interfaces. The PNGs are committed; `tests/test_docs.py` checks that each page that
uses one shows it.
"""

import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=wrong-import-position
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "images")
RANK = "#3f51b5"      # the site's indigo
SERVER = "#ef6c00"
LIGHT = "#e8eaf6"
GREY = "#757575"


def _canvas(width, height):
    figure, axes = plt.subplots(figsize=(width, height), dpi=110)
    axes.set_xlim(0, width)
    axes.set_ylim(0, height)
    axes.axis("off")
    return figure, axes


def _box(axes, x, y, text, color=RANK, width=1.3, height=0.55, text_color="white", size=10):
    axes.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                                  boxstyle="round,pad=0.04,rounding_size=0.12",
                                  facecolor=color, edgecolor="none"))
    axes.text(x, y, text, ha="center", va="center", color=text_color, fontsize=size)


def _bar(axes, x, y, length, height, color, style="round,pad=0.01", alpha=1.0):
    """A horizontal bar from `x`, centered on `y` (a span of time, a range of parameters)."""
    axes.add_patch(FancyBboxPatch((x, y - height / 2), length, height, boxstyle=style,
                                  facecolor=color, edgecolor="none", alpha=alpha))


def _arrow(axes, start, end, color=GREY, style="-|>", bend=0.0, width=1.6, shrink=22):
    axes.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=14,
                                   color=color, linewidth=width, shrinkA=shrink,
                                   shrinkB=shrink, connectionstyle=f"arc3,rad={bend}"))


def _save(figure, name):
    figure.savefig(os.path.join(OUT, name), bbox_inches="tight", facecolor="white")
    plt.close(figure)


def ring():
    figure, axes = _canvas(8, 4.6)
    count, center, radius = 4, (2.3, 2.2), 1.55
    points = [(center[0] + radius * math.sin(2 * math.pi * r / count),
               center[1] + radius * math.cos(2 * math.pi * r / count)) for r in range(count)]
    for rank, point in enumerate(points):
        _arrow(axes, point, points[(rank + 1) % count], color=RANK, bend=-0.25, shrink=26)
    for rank, point in enumerate(points):
        _box(axes, *point, f"rank {rank}")
    axes.text(center[0], center[1], "each step:\n1/P of the\ngradient\nto the next", ha="center",
              va="center", fontsize=9, color=GREY)
    axes.text(4.5, 3.7, "Ring all-reduce", fontsize=13, weight="bold")
    axes.text(4.5, 1.0, "1. reduce-scatter: P - 1 steps; after them\n"
                        "   rank r holds the sum of chunk r\n"
                        "2. all-gather: P - 1 more steps; every rank\n"
                        "   holds every summed chunk\n\n"
                        "Each rank sends 2 (P - 1) / P of the gradient,\n"
                        "whatever P: bandwidth-optimal. Gradients go\n"
                        "in buckets, each as soon as backprop made it.",
              fontsize=9.5, va="bottom")
    _save(figure, "diagram_ring.png")


def tree():
    figure, axes = _canvas(8, 4.2)
    levels = [[0], [1, 2], [3, 4, 5, 6]]
    positions = {}
    for depth, ranks in enumerate(levels):
        for index, rank in enumerate(ranks):
            positions[rank] = (0.7 + (index + 0.5) * 4.4 / len(ranks), 3.4 - 1.25 * depth)
    for rank in range(1, 7):
        parent = (rank - 1) // 2
        _arrow(axes, positions[rank], positions[parent], color=RANK, bend=0.15)
        _arrow(axes, positions[parent], positions[rank], color=SERVER, bend=0.15)
    for rank, point in positions.items():
        _box(axes, *point, f"rank {rank}", width=1.0)
    axes.text(5.5, 3.5, "Reduction tree (fanout 2)", fontsize=13, weight="bold")
    axes.text(5.5, 3.0, "— sums flow up to rank 0", color=RANK, fontsize=10)
    axes.text(5.5, 2.65, "— the total flows back down", color=SERVER, fontsize=10)
    axes.text(5.5, 0.4, "log_k(P) levels: fewer messages than\n"
                        "the ring's 2 (P - 1), more bytes per\n"
                        "link; chunks are pipelined, so a level\n"
                        "starts before the one below it ends.", fontsize=9.5, va="bottom")
    _save(figure, "diagram_tree.png")


def parameter_servers():
    figure, axes = _canvas(8, 4.2)
    servers = [(1.6, 3.3), (3.8, 3.3)]
    workers = [(0.8, 1.0), (2.1, 1.0), (3.4, 1.0), (4.7, 1.0)]
    for worker in workers:
        for server in servers:
            _arrow(axes, worker, server, color=RANK, bend=0.12, width=1.2)
            _arrow(axes, server, worker, color=SERVER, bend=0.12, width=1.2)
    for index, server in enumerate(servers):
        _box(axes, *server, f"server {index}\nshard {index}", color=SERVER, width=1.5, height=0.7)
    for rank, worker in enumerate(workers):
        _box(axes, *worker, f"worker {rank}", width=1.1)
    axes.text(5.6, 3.5, "Parameter servers", fontsize=13, weight="bold")
    axes.text(5.6, 3.05, "— push: each worker's gradient,\n   split by shard", color=RANK,
              fontsize=10, va="top")
    axes.text(5.6, 2.35, "— pull: the updated parameters", color=SERVER, fontsize=10,
              va="top")
    axes.text(5.6, 0.5, "The servers hold the variables and the\n"
                        "optimizer. Synchronous: a server applies\n"
                        "one update per step, after every worker's\n"
                        "push. Servers are processes of their own\n"
                        "(--num-servers K) or co-located.", fontsize=9.5, va="bottom")
    _save(figure, "diagram_parameter_servers.png")


def asynchronous():
    figure, axes = _canvas(8, 3.6)
    axes.text(0.1, 3.25, "Asynchronous parameter servers: every push is applied as it arrives",
              fontsize=12, weight="bold")
    pushes = {0: [1.3, 2.5, 3.7, 4.9], 1: [1.9, 3.4, 5.5], 2: [1.6, 2.9, 4.3, 5.2]}
    arrivals = sorted((t, worker) for worker, times in pushes.items() for t in times)
    version = {t: index + 1 for index, (t, _) in enumerate(arrivals)}
    axes.plot([1.0, 6.2], [2.6, 2.6], color=SERVER, linewidth=2)
    axes.text(0.1, 2.6, "server", va="center", color=SERVER, fontsize=10)
    for worker, times in pushes.items():
        y = 1.9 - 0.6 * worker
        axes.plot([1.0, 6.2], [y, y], color=RANK, linewidth=1.5)
        axes.text(0.1, y, f"worker {worker}", va="center", color=RANK, fontsize=9)
        previous = 1.0
        for t in times:
            _bar(axes, previous + 0.05, y, t - previous - 0.15, 0.2, LIGHT)
            _arrow(axes, (t, y), (t, 2.6), color=RANK, width=1.0, shrink=2)
            axes.text(t + 0.03, 2.68, f"v{version[t]}", fontsize=7.5, color=SERVER)
            previous = t
    axes.text(6.35, 1.6, "A worker's gradient was\ncomputed on the version\nit last pulled; "
                         "versions\napplied meanwhile are its\nstaleness. staleness=None:\n"
                         "unbounded (Downpour);\nstaleness=tau: a worker\nwaits when it is "
                         "tau\nversions ahead (SSP).", fontsize=8.5, va="center")
    _save(figure, "diagram_async.png")


def elastic():
    figure, axes = _canvas(8, 3.4)
    axes.text(0.1, 3.05, "Elastic job: tfdist-run -np 3 --min-np 2 --host-discovery-script S",
              fontsize=11.5, weight="bold")
    spans = {0: [(0.9, 2.6), (3.0, 4.9), (5.3, 7.6)], 1: [(0.9, 2.6), (3.0, 4.9), (5.3, 7.6)],
             2: [(0.9, 2.0), (5.3, 7.6)]}
    for rank, pieces in spans.items():
        y = 2.3 - 0.6 * rank
        axes.text(0.1, y, f"rank {rank}", va="center", fontsize=9, color=RANK)
        for start, end in pieces:
            _bar(axes, start, y, end - start, 0.34,
                 RANK if rank < 2 or start > 5 else "#9fa8da",
                 style="round,pad=0.01,rounding_size=0.08")
    axes.text(2.0, 1.1, "✕ lost", color="#c62828", fontsize=9, ha="left", va="center")
    for x, label in ((2.8, "backup at the\nlast agreed step;\nrestart with 2"),
                     (5.1, "slots back: resize\nat an agreed step;\nrestart with 3")):
        axes.plot([x, x], [0.75, 2.6], color=GREY, linestyle="--", linewidth=1)
        axes.text(x, 0.45, label, ha="center", va="top", fontsize=8.5, color=GREY)
    axes.text(6.45, 0.45, "ends with the\nuninterrupted\nrun's weights", ha="center",
              va="top", fontsize=8.5, color=GREY)
    _save(figure, "diagram_elastic.png")


def sharding():
    figure, axes = _canvas(8, 3.8)
    axes.text(0.1, 3.45, "Optimizer-state sharding (ZeRO stage 1), P = 3", fontsize=12,
              weight="bold")
    colors = [RANK, SERVER, "#2e7d32"]
    widths = [2.0, 2.0, 1.9]
    x = 1.3
    axes.text(0.1, 2.8, "parameters\n(every rank)", va="center", fontsize=9)
    for rank, width in enumerate(widths):
        _bar(axes, x, 2.8, width - 0.05, 0.4, colors[rank], style="square,pad=0", alpha=0.85)
        axes.text(x + width / 2, 2.8, f"range {rank}", ha="center", va="center", color="white",
                  fontsize=9)
        y = 1.9 - 0.55 * rank
        axes.text(0.1, y, f"rank {rank} keeps", va="center", fontsize=9)
        _bar(axes, x, y, width - 0.05, 0.36, colors[rank], style="square,pad=0", alpha=0.35)
        axes.text(x + width / 2, y, "Adam m, v of range", ha="center", va="center", fontsize=8)
        x += width
    axes.text(7.35, 2.8, "per step:", fontsize=9.5, weight="bold", va="center")
    axes.text(7.35, 1.4, "1. gradients summed\n   (reduce-scattered on\n   Horovod: each rank\n"
                         "   gets its range's sum)\n2. rank r updates\n   range r only\n"
                         "3. all-gather: every\n   rank has every range", fontsize=8.5,
              va="center")
    axes.text(0.1, 0.15, "Each rank holds 1/P of the optimizer state; saved files hold all of it.",
              fontsize=9, color=GREY)
    _save(figure, "diagram_sharding.png")


def _band(axes, y, name, text, x=0.6, width=8.3, height=0.42, color=LIGHT):
    """One layer of the package as a full-width band: its modules in bold, then what it is."""
    axes.add_patch(FancyBboxPatch((x, y - height / 2), width, height,
                                  boxstyle="round,pad=0.02,rounding_size=0.08",
                                  facecolor=color, edgecolor="none"))
    axes.text(x + 0.15, y, name, ha="left", va="center", fontsize=9.5, weight="bold",
              color=RANK)
    axes.text(x + 2.55, y, text, ha="left", va="center", fontsize=9)


def _frame(axes, x, y, width, height, color=RANK, style="-"):
    axes.add_patch(FancyBboxPatch((x, y), width, height,
                                  boxstyle="round,pad=0.02,rounding_size=0.12",
                                  facecolor="none", edgecolor=color, linewidth=1.4,
                                  linestyle=style))


def architecture():
    """The layers (imports point down) and, inside strategies/, the core calling the three mode
    interfaces, each with its two implementations."""
    figure, axes = _canvas(9, 9.6)
    axes.text(0.1, 9.45, "tfdist's layers, and a strategy's three modes", fontsize=13,
              weight="bold", va="center")
    _arrow(axes, (0.3, 9.05), (0.3, 0.35), color=GREY, shrink=0)
    axes.text(0.18, 4.7, "imports point down", rotation=90, ha="right", va="center",
              fontsize=9, color=GREY)
    for y, name, text in (
            (8.95, "launch/, server.py", "tfdist-run, tfdist-bench, python -m tfdist.server"),
            (8.45, "horovod/", "Horovod's Keras API over a per-rank-input ring strategy"),
            (7.95, "callbacks/", "learning-rate scaling, warmup, schedules; monitors")):
        _band(axes, y, name, text)

    # strategies/: the public strategies, the core, the three interfaces, the shared parts
    _frame(axes, 0.6, 2.88, 8.3, 4.8)
    axes.text(0.75, 7.45, "strategies/", fontsize=9.5, weight="bold", color=RANK, va="center")
    axes.text(2.0, 7.45, "(this layer also holds optimizers/ and profiling's report)",
              fontsize=8.5, color=GREY, va="center")
    publics = ("DataParallelStrategy\n(the base)", "RingAllReduce\nStrategy",
               "ReductionTree\nStrategy", "ParameterServer\nStrategy")
    for index, name in enumerate(publics):
        _box(axes, 1.72 + 2.02 * index, 6.95, name, width=1.88, height=0.55, size=8.5)
    _arrow(axes, (4.75, 6.66), (4.75, 6.43), color=GREY, shrink=0, width=1.3)
    axes.text(4.87, 6.55, "each: an aggregator + three modes", fontsize=8, color=GREY,
              va="center")
    _box(axes, 4.75, 6.1, "core/  DataParallelExtended  (strategy.extended)\n"
                          "communicator, aggregator, variables, each step by its plan",
         color=SERVER, width=6.0, height=0.6, size=9)

    _frame(axes, 0.78, 3.72, 7.94, 1.9, color=GREY, style="--")
    axes.text(0.92, 5.47, "modes/", fontsize=9, weight="bold", color=RANK, va="center")
    interfaces = (
        ("InputMode", ("GlobalBatch\nInput", "PerRank\nInput"), "per_rank_input=True"),
        ("Placement", ("Replicated\n(all whole)", "Sharded: optim.,\ngrads, params"),
         'sharding="..."'),
        ("UpdateMode", ("Synchronous\nUpdates", "Asynchronous\nUpdates"),
         'mode="async"'))
    for index, (interface, implementations, chosen_by) in enumerate(interfaces):
        x = 2.2 + 2.65 * index
        _arrow(axes, (4.75 + 1.2 * (index - 1), 5.8), (x, 5.36), color=GREY, shrink=0,
               width=1.3)
        _box(axes, x, 5.15, interface, width=2.2, height=0.4, size=9.5)
        for side, implementation in zip((-1, 1), implementations):
            ix = x + side * 0.63
            axes.plot([x + side * 0.3, ix], [4.95, 4.74], color=GREY, linewidth=1,
                      linestyle="--")
            _box(axes, ix, 4.45, implementation, color="#c5cae9", text_color="black",
                 width=1.2, height=0.56, size=8)
        axes.text(x - 0.63, 4.1, "default", ha="center", va="top", fontsize=7.5, color=GREY)
        axes.text(x + 0.63, 4.1, chosen_by, ha="center", va="top", fontsize=7.5, color=GREY)

    for index, (name, text) in enumerate((
            ("keras_patches/", "patches, on top"),
            ("step/", "plan, fused sums"),
            ("inputs/", "slices, checks"),
            ("state/", "global, compared"),
            ("keras_surface/", "reads Keras: bottom"))):
        x = 1.45 + 1.65 * index
        _box(axes, x, 3.28, "", color=LIGHT, width=1.55, height=0.52)
        axes.text(x, 3.39, name, ha="center", va="center", fontsize=8, weight="bold",
                  color=RANK)
        axes.text(x, 3.16, text, ha="center", va="center", fontsize=7.2)

    for y, name, text in (
            (2.5, "runtime, simulation", "process state, communicators, shutdown; "
                                         "ranks as threads"),
            (2.0, "fault_tolerance/", "backups (given a BackupJob), preemption, restarts"),
            (1.5, "aggregation/", "ring, tree, parameter servers, compression, cost model"),
            (1.0, "comm/", "engine registry; Open MPI, TF collectives, Horovod; RPC"),
            (0.5, "process_setup/", "and _tf, private_surface, errors, env_vars, versions")):
        _band(axes, y, name, text)
    _save(figure, "diagram_architecture.png")


DIAGRAMS = {"ring": ring, "tree": tree, "parameter_servers": parameter_servers,
            "async": asynchronous, "elastic": elastic, "sharding": sharding,
            "architecture": architecture}


def main(names=()):
    """Draw the diagrams `names` (keys of `DIAGRAMS`), or every one."""
    unknown = sorted(set(names) - set(DIAGRAMS))
    if unknown:
        raise SystemExit(f"unknown diagram(s) {unknown}; choose from {sorted(DIAGRAMS)}")
    os.makedirs(OUT, exist_ok=True)
    for name, draw in DIAGRAMS.items():
        if not names or name in names:
            draw()


if __name__ == "__main__":
    main(sys.argv[1:])
