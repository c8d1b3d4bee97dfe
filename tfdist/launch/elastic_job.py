"""`tfdist-run --min-np A --max-np B [--host-discovery-script S]`: a job that changes size.

The loop around `cli.run_job`, with the decisions of
`tfdist.fault_tolerance.membership` (when, and to what size) and Horovod
Elastic's flags and discovery format (`host_discovery`):

1. Start at `-np` processes (fewer if S reports fewer slots; at least A).
2. While the job runs, S is run every second on a thread. A changed report
   that changes the job's size writes a resize request
   (`elastic_channel`); the ranks of a `fit` with a
   `keras.callbacks.BackupAndRestore` see it, back up after one agreed
   training step and exit with 42 (the preemption path) - no step is lost -
   and the job starts again at the new size.
3. A process that fails (an error, a kill) ends the run: the others are
   stopped and the job starts again with the processes left (at least A)
   from the last backup: at most `save_freq` steps are redone.
4. Fewer than A slots: the job waits for S to report more, up to
   `--elastic-timeout` (600 s, Horovod's default), then exits with code 1
   and says so; the backup stays for a rerun.

Every resize is one line: from P to P' processes, why, and where the job
resumes (the chief's last backup, read from the channel). The global batch
is the same at every size, so the job ends with the uninterrupted run's
weights. A SIGINT/SIGTERM to the launcher stops the job (no restart);
`--max-restarts` (unbounded here unless given) counts failures,
`--reset-limit` (Horovod's) every restart of the job, resizes included.

Cost: one discovery process per second in the launcher; a resize costs a
backup and a new start of the processes (measured in
`benchmarks/results/elastic_resize.json`).
"""

import shutil
import signal
import sys
import tempfile
import time

from tfdist import env_vars
from tfdist.fault_tolerance import elastic_channel, membership as membership_lib, restarts
from tfdist.launch import host_discovery, processes

DEFAULT_ELASTIC_TIMEOUT_SECONDS = 600.0


def say(message):
    print(f"tfdist-run: {message}", file=sys.stderr, flush=True)


def is_elastic(args) -> bool:
    return (args.min_np is not None or args.max_np is not None
            or bool(args.host_discovery_script))


def run(args, run_job) -> int:
    """Run the job elastically; its exit code. `run_job(args, restart, num_proc, extra_env,
    on_poll)` runs one group of processes (`cli.run_job`)."""
    script = args.host_discovery_script
    discovery = (host_discovery.DiscoveryScript(script, args.slots_per_host) if script
                 else host_discovery.FixedSlots(args.num_proc))
    try:
        members = membership_lib.Membership(
            args.num_proc, args.min_np if args.min_np is not None else args.num_proc,
            args.max_np if args.max_np is not None or script else args.num_proc,
            discovers=bool(script))
        first = discovery.slots()
    except (RuntimeError, ValueError) as error:
        say(str(error))
        return 1
    poller = host_discovery.Poller(discovery).start(first) if script else None
    channel = tempfile.mkdtemp(prefix="tfdist-elastic-")
    try:
        return _loop(args, run_job, members, poller, channel, members.start(first))
    finally:
        if poller is not None:
            poller.stop()
        shutil.rmtree(channel, ignore_errors=True)


def _loop(args, run_job, members, poller, channel, decision):
    previous_size, runs, failures = 0, 0, 0
    while True:
        if decision.action == membership_lib.WAIT:
            decision = _wait_for_slots(members, poller, args.elastic_timeout, decision)
        if decision.action == membership_lib.GIVE_UP:
            say(f"{decision.why}: the job stops{_kept(channel)}")
            return 1
        if previous_size:
            say(f"resizing from {previous_size} to {decision.size} processes: {decision.why}; "
                f"{_where(channel)}")
        elif decision.size != args.num_proc:
            say(f"starting with {decision.size} processes, not {args.num_proc}: {decision.why}")
        elastic_channel.withdraw_request(channel)
        watcher = ResizeWatcher(members, poller, channel, args.elastic_timeout)
        members.started(decision.size)
        code, group = run_job(args, runs, decision.size,
                              {env_vars.ELASTIC_DIR.name: channel}, watcher.poll)
        runs += 1
        members.stopped()
        if code == 0 or group is None or group.stopped_by_signal is not None:
            return code
        label, failed_code = group.failure or ("?", code)
        previous_size = decision.size
        if failed_code == restarts.PREEMPTED_EXIT_CODE:
            why = (watcher.requested.why if watcher.requested is not None
                   else f"the job was preempted ({processes.describe(label)} exited with code "
                        f"{failed_code})")
            decision = members.next_run(poller.latest() if poller else None, why)
        else:
            failures += 1
            if args.max_restarts is not None and failures > args.max_restarts:
                say(f"{processes.describe(label)} exited with code {failed_code}: out of "
                    f"restarts (--max-restarts {args.max_restarts})")
                return code
            lost_workers = 0 if label.startswith("s") else 1  # a server: the same workers
            decision = members.lost(lost_workers, f"{processes.describe(label)} exited with "
                                                  f"code {failed_code}", previous_size)
        if args.reset_limit is not None and runs > args.reset_limit:
            say(f"{decision.why}: the job was restarted {runs - 1} time(s), --reset-limit "
                f"{args.reset_limit}: it stops{_kept(channel)}")
            return code


def _backup_at(channel):
    """Where the chief's last backup is, in words (None: no backup written in this job)."""
    backup = elastic_channel.last_backup(channel)
    if backup is None:
        return None
    if "committed" in backup:  # hvd.elastic's state
        state = ", ".join(f"{k} {v}" for k, v in sorted(backup["committed"].items()))
        return (f"the state hvd.elastic committed last ({state}; by {backup['world_size']} "
                "process(es))")
    return (f"the backup at epoch {backup['epoch'] + 1} after {backup['steps_done']} of its "
            f"steps (optimizer step {backup['iterations']}, written by {backup['world_size']} "
            "process(es))")


def _where(channel):
    backup = _backup_at(channel)
    return (f"the ranks resume from {backup}" if backup is not None
            else "no backup was written: the ranks start from the beginning")


def _kept(channel):
    backup = _backup_at(channel)
    return f" (a rerun resumes from {backup})" if backup is not None else ""


def _wait_for_slots(members, poller, timeout, decision):
    """Poll the discovery until `min_np` slots are usable or `timeout` seconds passed (or the
    launcher is told to stop: no process runs, so nothing else would hear it)."""
    # The stop signals are ours before the line that says the launcher waits: a SIGTERM sent
    # on reading it must end the wait (it went to the process group's relay, which had no
    # process to stop, and the wait ran its whole timeout).
    stopped = []
    previous = {signum: signal.signal(signum, lambda number, _frame: stopped.append(number))
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        say(f"{decision.why}: waiting up to {timeout:g} s (--elastic-timeout) for the "
            "discovery script to report more")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not stopped:
            time.sleep(host_discovery.INTERVAL_SECONDS / 2)
            slots = poller.latest()
            if slots is not None and slots != members.reported:
                decision = members.next_run(slots, decision.why)
                if decision.action == membership_lib.RUN:
                    return decision
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if stopped:
        return membership_lib.Decision(
            membership_lib.GIVE_UP, decision.size,
            f"{decision.why}; received {signal.Signals(stopped[0]).name} while waiting")
    return membership_lib.Decision(membership_lib.GIVE_UP, decision.size,
                                   f"{decision.why}, for {timeout:g} s (--elastic-timeout)")


class ResizeWatcher:
    """Called while a run's processes run (`ProcessGroup.wait`'s `on_poll`): turns a changed
    discovery report into a resize request, withdraws it when the slots change back, and
    withdraws it when no rank took it within `timeout` seconds (no `fit` with a backup is
    running to take it), saying so."""

    def __init__(self, members, poller, channel, timeout):
        self._members, self._poller, self._channel = members, poller, channel
        self._timeout = timeout
        self.requested = None  # the RESIZE decision asked of the running ranks
        self._since = 0.0

    def poll(self):
        if self._poller is None:
            return
        slots = self._poller.latest()
        if slots is None:
            return
        decision = self._members.discovered(slots)
        if decision is not None:
            size = self._members.size
            elastic_channel.request_resize(
                self._channel, f"tfdist-run's request to resize from {size} to "
                               f"{decision.size} processes ({decision.why})")
            if self.requested is None:
                self._since = time.monotonic()
            self.requested = decision
            return
        if self.requested is None:
            return
        if self._members.size == self._members.target():
            elastic_channel.withdraw_request(self._channel)  # the slots are back to the size
            self.requested = None
        elif time.monotonic() - self._since > self._timeout:
            elastic_channel.withdraw_request(self._channel)
            say(f"no rank took the request to resize to {self.requested.size} processes within "
                f"{self._timeout:g} s (--elastic-timeout): a fit with a "
                "keras.callbacks.BackupAndRestore takes it at its next step; the job goes on "
                f"with {self._members.size}")
            self.requested = None
