"""How many processes an elastic job runs: the decisions of `tfdist-run --min-np/--max-np`.

Pure bookkeeping (no processes, no clock): `tfdist.launch.elastic_job` feeds
it the discovery script's slot counts and the job's failures, and does what
it decides. The rules (Horovod Elastic's, on one machine):

- **Start** with `-np` processes, fewer if the discovery reports fewer slots
  (never fewer than `min_np`: below it the job waits for capacity).
- **A lost process** (a rank that exited with an error or was killed): the
  job goes on with the processes left (fewer if the slots are fewer), from
  its last backup. It grows again only with the discovery's next *changed*
  report (as Horovod's blacklisted host comes back when the hosts change);
  without a discovery script it does not grow again. A report that already
  took the lost slot away (the discovery saw the loss first) is not counted
  twice.
- **A changed report** while the job runs: the job resizes to the reported
  slots (capped at `max_np`) at an agreed step - grows when capacity came
  back, shrinks when it was taken away. An unchanged report changes nothing
  (a job that started below the slots it could have does not grow unless
  the slots change, as under Horovod).
- **Fewer than `min_np` usable slots**: the job waits for a report that
  gives it `min_np` (the launcher gives up after `--elastic-timeout`);
  without a discovery script nothing can report more, so it gives up at once.

The global batch never changes with the size (tfdist slices it), so every
size trains the same steps: the resumed job ends with the uninterrupted
run's weights.
"""

import dataclasses
from typing import Optional

RUN = "run"  # start the job at `size` (the first run, or again after it stopped)
RESIZE = "resize"  # the running job should stop at an agreed step and start at `size`
WAIT = "wait"  # fewer than min_np slots: wait for the discovery to report more
GIVE_UP = "give-up"  # fewer than min_np slots and nothing can report more


@dataclasses.dataclass(frozen=True)
class Decision:
    action: str
    size: int  # processes to run (RUN, RESIZE), or usable now (WAIT, GIVE_UP)
    why: str


class Membership:
    """The elastic job's size, from the discovered slots, its losses and `min_np`..`max_np`.

    Args:
        num_proc: the size to start with (`-np`).
        min_np, max_np: the limits (`--min-np`, `--max-np`; max_np None: the slots).
        discovers: whether a discovery script can report changes (without one
            the slots are `num_proc`, fixed).
    """

    def __init__(self, num_proc: int, min_np: int, max_np: Optional[int], discovers: bool):
        if not 1 <= min_np <= num_proc or (max_np is not None and max_np < num_proc):
            raise ValueError(f"need 1 <= --min-np <= -np <= --max-np. Got: --min-np {min_np}, "
                             f"-np {num_proc}, --max-np {max_np}")
        self.num_proc, self.min_np, self.max_np = num_proc, min_np, max_np
        self.discovers = discovers
        self.size = 0  # processes of the running job (0: none running)
        self.reported: Optional[int] = None  # the discovery's last slot count

    @property
    def usable(self) -> int:
        return self.reported or 0

    def _capped(self, slots: int) -> int:
        return slots if self.max_np is None else min(slots, self.max_np)

    def target(self) -> int:
        """The size the usable slots give (at most `max_np`)."""
        return self._capped(self.usable)

    def _report(self, slots: int) -> Optional[str]:
        """Take a report; the change it makes, in words (None: unchanged)."""
        if slots < 0:
            raise ValueError(f"slots must be >= 0. Got: {slots}")
        if slots == self.reported:
            return None
        before, self.reported = self.reported, slots
        return (f"the discovery script reports {slots} slot(s)"
                + ("" if before is None else f" instead of {before}"))

    def _run_or_wait(self, target: int, why: str) -> Decision:
        if target >= self.min_np:
            return Decision(RUN, target, why)
        if not self.discovers:
            return Decision(GIVE_UP, target,
                            f"{why}; fewer than --min-np {self.min_np} processes can run and "
                            "there is no --host-discovery-script to report more")
        return Decision(WAIT, target, f"{why}; fewer than --min-np {self.min_np} slots")

    def start(self, slots: int) -> Decision:
        """The first run: `-np` processes, fewer when fewer slots are reported."""
        why = self._report(slots) or f"{slots} slot(s)"
        return self._run_or_wait(min(self.num_proc, self.usable), why)

    def started(self, size: int) -> None:
        """A run of `size` processes started."""
        self.size = size

    def stopped(self) -> None:
        """The run ended (no process of the job is left)."""
        self.size = 0

    def discovered(self, slots: int) -> Optional[Decision]:
        """A report while the job runs: RESIZE when it changes the job's size, else None."""
        why = self._report(slots)
        if why is None or not self.size:
            return None
        target = self.target()
        if target == self.size:
            return None
        return Decision(RESIZE, target, why)

    def lost(self, count: int, why: str, size: int) -> Decision:
        """`count` of the `size` processes of the run that just ended failed (`why`): the size
        to go on with."""
        self.size = 0
        return self._run_or_wait(min(size - count, self.target()), why)

    def next_run(self, slots: Optional[int], why: str) -> Decision:
        """The job stopped for a resize (or waits): the size to start it at now, given the
        latest report (`slots`; None: no new report)."""
        if slots is not None:
            why = self._report(slots) or why
        return self._run_or_wait(self.target(), why)
