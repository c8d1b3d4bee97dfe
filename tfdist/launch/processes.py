"""Start the local processes of a job, relay their output, and stop them together.

Each child runs in its own session (so a signal reaches its whole process
tree) and asks the kernel to SIGTERM it if the launcher dies, so that no
orphan outlives `tfdist-run`. Output lines are prefixed with the process's
label ("[0]", "[1]", ..., "[s0]" for servers) and pass through the job's
`OutputFilter` (start-up noise and repeated warnings left out).
"""

import collections
import os
import signal
import subprocess
import sys
import threading
import time

from tfdist.fault_tolerance.restarts import PREEMPTED_EXIT_CODE
from tfdist.process_setup.child_processes import die_with_parent
from tfdist.launch.output_filter import OutputFilter

TERMINATE_GRACE_SECONDS = 10.0
# A rank reported failing while mpirun, which relays it, still runs: mpirun aborts the job
# itself (it kills the other ranks and relays their last lines); a signal during its own abort
# crashes it in PMIx_Finalize ("abort is already in progress", a backtrace). It is signalled
# only if it has not ended after this (held by a stranger, it never would).
OWN_ABORT_GRACE_SECONDS = 5.0


class ManagedProcess:
    """One child process whose output is relayed line by line with a label."""

    def __init__(self, label, command, env, output=None, output_filter=None, split_label=None,
                 reported_failures=None):
        self.label = label
        self._output = output or sys.stdout
        self._filter = output_filter or OutputFilter(enabled=False)
        self._keep = {label: self._filter.stream()}  # per label: each rank's lines filtered
        self._relayed = {label: collections.deque(maxlen=8)}  # per label: its last lines
        self._reports_printed = set()  # labels whose exit report's lines were printed
        # line -> (label, text): a process relaying several ranks' lines (mpirun's, tagged
        # by `tfdist.launch.mpi_rank`: `mpi_job.split_label`); (None, text) keeps this label,
        # (label, None) reports that rank's failure
        self._split_label = split_label
        self.failed_label = None  # the first rank this process reported failing
        # () -> [(rank label, exit code)] of its ranks that failed, read beside the process
        # (mpirun's ranks leave exit reports: `mpi_job.rank_failures`), so that a rank's
        # failure is seen even while the process relaying it does not end
        self._reported_failures = reported_failures
        self.popen = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
        self._relay = threading.Thread(target=self._relay_output, daemon=True)
        self._relay.start()

    def _relay_output(self):
        for raw in iter(self.popen.stdout.readline, b""):
            label, text = None, raw.decode(errors="replace")
            if self._split_label is not None:
                label, text = self._split_label(text)
                if text is None:
                    self.failed_label = self.failed_label or label
                    continue
            label = self.label if label is None else label
            if label not in self._keep:
                self._keep[label] = self._filter.stream()
                self._relayed[label] = collections.deque(maxlen=8)
            self._relayed[label].append(text.rstrip("\n"))
            prefix = f"[{label}] ".encode()
            for line in self._keep[label](text):
                self._write(prefix, line)

    def _write(self, prefix, line):
        out = getattr(self._output, "buffer", None)
        if out is not None:
            out.write(prefix + line.encode(errors="replace"))
            out.flush()
        else:
            self._output.write(prefix.decode() + line)
            self._output.flush()

    @property
    def relays_ranks(self):
        """True for a process whose output carries several ranks' lines (mpirun's)."""
        return self._split_label is not None

    def finish_relay(self, timeout=5.0):
        self._relay.join(timeout)

    def poll(self):
        return self.popen.poll()

    def failure(self):
        """The exit code (Popen's) that fails the job: this process's own non-zero one, or one
        of its ranks reported beside it (`reported_failures`), else None."""
        code = self.popen.poll()
        if code is not None and code != 0:
            return code
        for failure in (self._reported_failures or list)():
            self.failed_label = self.failed_label or failure.label
            self._print_unrelayed(failure.label, failure.last_lines)
            return failure.code
        return None

    def _print_unrelayed(self, label, last_lines):
        """A rank's last lines, from its exit report, where the process relaying its output
        has not relayed them (mpirun held by a stranger relays nothing)."""
        if (not last_lines or label in self._reports_printed
                or last_lines[-1] in self._relayed.get(label, ())):
            return
        self._reports_printed.add(label)
        keep = self._keep.setdefault(label, self._filter.stream())
        for text in last_lines:
            for line in keep(text + "\n"):
                self._write(f"[{label}] ".encode(), line)

    def signal_group(self, signum):
        try:
            os.killpg(self.popen.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def describe(label):
    """'rank 2' for a worker labelled "2", 'server 0' for "s0", 'mpirun' for the mpirun starting
    every rank (`tfdist.launch.mpi_job`) when no rank reported its failure."""
    if label == "mpirun":
        return "mpirun (no rank reported a failure)"
    return f"server {label[1:]}" if label.startswith("s") else f"rank {label}"


def exit_code_of(returncode):
    """Shell convention: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class ProcessGroup:
    """All processes of a job; the job fails as soon as any process fails."""

    def __init__(self, log=None, output_filter=None):
        self.processes = []
        self._output_filter = output_filter
        self._log = log or (lambda msg: print(f"tfdist-run: {msg}", file=sys.stderr, flush=True))
        self._stop_signal = None
        self.failure = None  # (label, exit code) of the process whose failure ended the job

    @property
    def stopped_by_signal(self):
        """The SIGINT/SIGTERM the launcher received and relayed (None if it received none)."""
        return self._stop_signal

    def start(self, label, command, env, split_label=None, reported_failures=None):
        self.processes.append(ManagedProcess(label, command, env,
                                             output_filter=self._output_filter,
                                             split_label=split_label,
                                             reported_failures=reported_failures))

    def forward_signals(self):
        """Relay SIGINT/SIGTERM to every worker instead of dying silently; a second one
        kills every process at once (said once each).

        Parameter servers are not signalled: the workers may still need them to finish
        a step (a preemption notice backs up after the next one, `tfdist.strategies.
        preemption`); `wait` stops them once the workers have exited.
        """

        def handler(signum, _frame):
            name = signal.Signals(signum).name
            if self._stop_signal is not None:  # asked again (a second Ctrl-C): no more waiting
                self._log(f"received {name} again: killing every process now")
                for proc in self.processes:
                    proc.signal_group(signal.SIGKILL)
                return
            self._stop_signal = signum
            self._log(f"received {name}, stopping all processes (again to kill them at once)")
            for proc in self.processes:
                if not proc.label.startswith("s"):
                    proc.signal_group(signum)

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    def wait(self, workers, poll_interval=0.1, keep_going=False, on_poll=None):
        """Wait until the workers finish; return the job's exit code.

        `workers` are the labels that must all exit 0 for success; the other
        processes (servers) are stopped once the workers are done. The first
        non-zero exit stops everyone and becomes the job's exit code - with
        `keep_going`, a failed worker does not stop the others (asynchronous
        training goes on without it): the job ends when every worker has
        exited, with the first failure's code; a server that fails before any
        worker did still stops everyone. A worker that exits with 42 (it backed up on a
        preemption notice or a resize request, as every rank does at the same step) gives
        the others `TERMINATE_GRACE_SECONDS` to exit by themselves before they are
        terminated. `on_poll()` is called every `poll_interval` (an elastic job's watcher).
        """
        workers = set(workers)
        first_failure, tolerated = None, set()
        while True:
            failed = failed_code = None
            for proc in self.processes:
                code = proc.failure()
                if code is not None and failed is None and proc.label not in tolerated:
                    failed, failed_code = proc, code
            if failed is not None:
                code = exit_code_of(failed_code)
                if failed.failed_label is None and failed.relays_ranks:
                    failed.finish_relay()  # its ranks' exit reports are in the last lines
                label = failed.failed_label or failed.label
                lost_worker_reported = failed.label not in workers and tolerated
                if keep_going and self._stop_signal is None and (
                        failed.label in workers or lost_worker_reported):
                    # A server reports the lost worker when the others are done: no reason
                    # to stop the workers still exiting.
                    self._log(f"{describe(label)} exited with code {code}; "
                              "the other workers go on (--keep-going)")
                    tolerated.add(failed.label)
                    first_failure = first_failure if first_failure is not None else code
                    continue
                if code == PREEMPTED_EXIT_CODE:  # the others back up too, and exit
                    self._wait_for_all(TERMINATE_GRACE_SECONDS,
                                       [p for p in self.processes if p.label in workers])
                elif self._stop_signal is None:
                    self._log(
                        f"{describe(label)} exited with code {code}; "
                        "terminating the other processes"
                    )
                self.failure = (label, code)
                if failed.relays_ranks and failed.poll() is None:
                    self._wait_for_all(OWN_ABORT_GRACE_SECONDS, [failed])
                self.terminate_all()
                return code
            if all(p.poll() is not None for p in self.processes if p.label in workers) and \
                    all(p.poll() == 0 for p in self.processes
                        if p.label in workers and p.label not in tolerated):
                if tolerated:  # servers stop by themselves and report the lost worker
                    self._wait_for_all(TERMINATE_GRACE_SECONDS)
                self.terminate_all()
                return first_failure or 0
            if on_poll is not None:
                on_poll()
            time.sleep(poll_interval)

    def _wait_for_all(self, seconds, processes=None):
        deadline = time.monotonic() + seconds
        for proc in self.processes if processes is None else processes:
            try:
                proc.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return

    def terminate_all(self, grace=TERMINATE_GRACE_SECONDS):
        """SIGTERM every live process group, then SIGKILL what is left after `grace`."""
        for proc in self.processes:
            if proc.poll() is None:
                proc.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.processes:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                proc.popen.wait(remaining)
            except subprocess.TimeoutExpired:
                proc.signal_group(signal.SIGKILL)
                proc.popen.wait()
        for proc in self.processes:
            proc.signal_group(signal.SIGKILL)  # stray grandchildren in the session
            proc.finish_relay()
