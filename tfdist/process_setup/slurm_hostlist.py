"""Slurm's compressed host lists ("gpu[01-03,07],login"), expanded.

A list is names separated by commas outside brackets; each name may hold
bracket groups of comma-separated numbers and ranges ("rack[1-2]-n[01-08]"),
zero padding kept. `first_host` reads only what it needs (the rendezvous
host of a job step), so its cost is the length of the text whatever the
ranges; `expand_hostlist` returns every name (cost: the number of names).
Malformed text raises ValueError naming it.
"""


def expand_hostlist(text):
    """Every host of `text`, in order: "gpu[01-03,07],login" -> gpu01, gpu02, gpu03, gpu07, login."""
    return [host for name in _names(text) for host in _expand(name, text)]


def first_host(text):
    """The first host of `text` without expanding the rest ("n[5-900000]" -> "n5")."""
    names = _names(text)
    for name in names[1:]:
        next(iter(_expand(name, text)), None)  # validate every name's syntax (cheap)
    return next(iter(_expand(names[0], text)))


def _names(text):
    names, depth, start = [], 0, 0
    for i, char in enumerate(text + ","):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if not 0 <= depth <= 1:
            raise ValueError(f"Malformed Slurm host list {text!r}.")
        if char == "," and depth == 0:
            if text[start:i].strip():
                names.append(text[start:i].strip())
            start = i + 1
    if depth or not names:
        raise ValueError(f"Malformed Slurm host list {text!r}.")
    return names


def _ranges(group, text):
    ranges = []
    for part in group.split(","):
        low, _, high = part.partition("-")
        high = high or low
        if not low.isdigit() or not high.isdigit() or int(high) < int(low):
            raise ValueError(f"Malformed range {part!r} in Slurm host list {text!r}.")
        ranges.append((low, high))
    return ranges


def _expand(pattern, text):
    """The hosts of one name, lazily (a generator)."""
    if "[" not in pattern:
        if "]" in pattern:
            raise ValueError(f"Malformed Slurm host list {text!r}.")
        yield pattern
        return
    head, rest = pattern.split("[", 1)
    if "]" in head or "]" not in rest:
        raise ValueError(f"Malformed Slurm host list {text!r}.")
    group, tail = rest.split("]", 1)
    for low, high in _ranges(group, text):
        for number in range(int(low), int(high) + 1):
            for end in _expand(tail, text):
                yield head + str(number).zfill(len(low)) + end
