"""What the ranks of a job agree on before they commit to anything: engines, versions, secret.

Each process decides some things for itself at start-up: which engines it can run (the MPI
engine needs its compiled ops, built where a compiler is: a host without `mpicxx` has none;
Horovod needs an importable build), which versions of tfdist, TensorFlow and Keras it
imports. Ranks that decided differently would commit to different engines - one in
`MPI_Init`'s collectives, another in `hvd.init()` - and wait for each other until killed.
So before a strategy starts an engine, every rank sends its `proposal` through the
launcher's channel (`tfdist.comm.launcher_channel`: MPI in an MPI job, else the launcher's
key-value store) and `settle` turns the proposals into one `Agreement`, the same on every
rank:

* the engines every rank can run (the intersection), with why each engine some rank cannot
  run was left out, naming the ranks - "auto" then chooses among these;
* the versions must be equal: different ones fail at once on every rank, naming the ranks
  that differ from rank 0 (a `ClusterError`);
* the job's secret (`tfdist.process_setup.job_secret`): rank 0's proposal carries one where
  the job has none and the channel is MPI (authenticated by the launcher); every rank then
  holds rank 0's.

Where the launcher gives no channel before an engine starts (TF_CONFIG, Kubernetes, srun
without PMIx, tfdist-run with neither MPI nor Horovod), there is one engine to run and
nothing is exchanged. Cost: one all-gather of a few hundred bytes per process, once.
"""

import json
from typing import Dict, List, NamedTuple, Optional, Sequence

from tfdist.errors import ClusterError

# A proposal's keys and their types: anything else is not a proposal.
_FIELDS = {"engines": list, "missing": dict, "versions": dict, "secret": str}


class Agreement(NamedTuple):
    """What every rank of the job agreed (`settle`)."""

    engines: tuple  # the engines every rank can run, in the proposals' order
    left_out: Dict[str, str]  # engine -> why some ranks cannot run it (naming them)
    secret: Optional[str]  # rank 0's secret, where it sent one


def proposal(engines: Sequence[str], missing: Dict[str, str], versions: Dict[str, str],
             secret: Optional[str] = None) -> str:
    """This rank's proposal (JSON): the engines it can run, why it cannot run the others it
    knows (`missing`: engine -> reason), its `versions` ({package: version}) and, on rank 0
    only, the job's secret to share."""
    return json.dumps({"engines": list(engines), "missing": dict(missing),
                       "versions": dict(versions), "secret": secret or ""},
                      sort_keys=True)


def check_proposal(text: str, sender: int) -> None:
    """A ValueError unless `text` is a proposal (`launcher_channel`'s check)."""
    del sender
    value = json.loads(text)  # a JSONDecodeError is a ValueError
    if not isinstance(value, dict) or set(value) != set(_FIELDS) or not all(
            isinstance(value[key], kind) for key, kind in _FIELDS.items()):
        raise ValueError("not a tfdist proposal")


def settle(rank: int, proposals: List[str]) -> Agreement:
    """Every rank's proposal (rank order) as one `Agreement`; a `ClusterError` naming the
    ranks whose versions differ from rank 0's."""
    parsed = [json.loads(text) for text in proposals]
    differing = [(r, p["versions"]) for r, p in enumerate(parsed)
                 if p["versions"] != parsed[0]["versions"]]
    if differing:
        detail = "; ".join(f"rank {r}: {_versions(v)}" for r, v in differing)
        raise ClusterError(
            f"tfdist rank {rank}: the ranks run different versions (rank 0: "
            f"{_versions(parsed[0]['versions'])}; {detail}); install the same versions on "
            "every host: the ranks of one job must run the same code.")
    engines = tuple(e for e in parsed[0]["engines"] if all(e in p["engines"] for p in parsed))
    known = {e for p in parsed for e in list(p["engines"]) + list(p["missing"])}
    left_out = {}
    for engine in sorted(known - set(engines)):
        lacking = [r for r, p in enumerate(parsed) if engine not in p["engines"]]
        reasons = sorted({parsed[r]["missing"].get(engine, "not available") for r in lacking})
        ranks = ", ".join(str(r) for r in lacking)
        left_out[engine] = (f"rank{'s' if len(lacking) > 1 else ''} {ranks} cannot run it: "
                            f"{'; '.join(reasons)}")
    return Agreement(engines, left_out, parsed[0]["secret"] or None)


def _versions(versions: Dict[str, str]) -> str:
    return ", ".join(f"{name} {version}" for name, version in sorted(versions.items()))
