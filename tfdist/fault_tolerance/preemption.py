"""Preemption notices: a SIGTERM to any rank makes every rank back up at one step and exit.

Preemptible and spot VMs get 30 s to 2 min of notice as a SIGTERM; Slurm
sends one before its kill (`sbatch --signal=TERM@<seconds>`), Kubernetes
before it drains a node. During a `fit` with a
`keras.callbacks.BackupAndRestore` (the notice is *armed*), tfdist turns it
into a backup at an agreed step:

1. the signalled rank raises the `preempt` flag (`agreed_flags`): the
   handler only records it, whatever the process is doing (a step, a save);
2. the next training step carries the flag in its one all-reduce, so every
   rank sees it after that same step (at most one step after the notice);
3. every rank then backs up at that step - the chief writes the backup,
   every rank its own compression residuals (`keras_patches.backup`) -
   waits for the others, and exits with `PREEMPTED_EXIT_CODE` (42, the code
   of tf-keras' `PreemptionCheckpointHandler`), which launchers tell apart
   from a crash (`tfdist-run --max-restarts` restarts on it).

No trained step is lost: rerun (or restarted), the job resumes at the next
step. A second notice changes nothing; a notice before the first step or
after the last is taken at the next training step of this `fit`, or not at
all. Unarmed (no such `fit` running), tfdist's handler is not installed and
the signal does what it does without tfdist (the default: terminate). A notice
a signal gave that no step takes within the job's timeout (training
stopped in a callback, a hang) terminates the process as the signal would
have.

The signal is `TFDIST_PREEMPTION_SIGNAL` (a name: SIGTERM by default,
SIGUSR1, ...; "none": no handler). `watch(check, interval)` polls a callable
instead (a cloud metadata endpoint, a file) and gives the notice when it
returns True (or a reason). Under an elastic `tfdist-run` the first armed
`fit` starts one such watcher on the launcher's resize request
(`elastic_channel`): a resize is a notice the launcher gives every rank.

Cost: nothing per step beyond the flag's float in the step's all-reduce
(`agreed_flags`) and one read of the agreed flags after each training step
of an armed `fit`.
"""

import os
import signal
import sys
import threading
import weakref

from tfdist import env_vars
from tfdist.fault_tolerance import elastic_channel
from tfdist.fault_tolerance.agreed_flags import PREEMPT
from tfdist.fault_tolerance.restarts import PREEMPTED_EXIT_CODE
ENV_PREEMPTION_SIGNAL = env_vars.PREEMPTION_SIGNAL.name

_notices = weakref.WeakSet()  # every PreemptionNotice of this process (one per rank thread)
_installed = {}  # signal number -> the handler it had before tfdist's
_install_lock = threading.Lock()
_resize_watcher = []  # the thread watching an elastic launcher's resize request, once started


def preemption_signal():
    """The signal that gives the notice (None: `TFDIST_PREEMPTION_SIGNAL=none`)."""
    name = env_vars.PREEMPTION_SIGNAL.get(default="SIGTERM").strip().upper()
    if name in ("", "NONE", "0"):
        return None
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return signal.Signals[name]
    except KeyError:
        raise ValueError(f"{ENV_PREEMPTION_SIGNAL} must name a signal (SIGTERM, SIGUSR1, ...) "
                         f"or be 'none'. Got: {env_vars.PREEMPTION_SIGNAL.get()!r}") from None


class PreemptionNotice:
    """This rank's preemption notice: armed during a `fit` that backs up, given by a signal.

    Args:
        flags: the strategy's `AgreedFlags`.
        rank: this process's rank (for messages).
        timeout: seconds a notice may wait for a training step to take it.
    """

    def __init__(self, flags, rank, timeout):
        self._flags = flags
        self.rank = rank
        self._timeout = timeout
        self.armed = False
        self.noticed = False
        self._signal = None  # the signal that gave the pending notice, if one did
        self._fallback = None
        _notices.add(self)

    def arm(self):
        """A `fit` with a backup starts: notices are taken at its steps (the signal handler
        is installed only while a `fit` is armed: otherwise the signal acts at once)."""
        preemption_signal()  # a malformed TFDIST_PREEMPTION_SIGNAL is refused before training
        self.armed = True
        _update_handler()
        _watch_resize_requests()

    def disarm(self):
        """The `fit` ended: the signal acts as it did before (a pending notice too)."""
        self.armed = False
        _update_handler()
        if self._fallback is not None:
            self._fallback.cancel()
            self._fallback = None
        if self.noticed:  # given after the fit's last training step
            self.noticed = False
            self._flags.lower_flag(PREEMPT)
            if self._signal is not None:
                _act_as_before(self._signal)

    def notice(self, reason="a preemption notice", signum=None):
        """Give the notice (from the signal handler, with its `signum`; a watcher; a test)."""
        if self.noticed:
            return
        self.noticed = True
        self._signal = signum
        self._flags.raise_flag(PREEMPT)
        print(f"tfdist: rank {self.rank} received {reason}: every rank backs up after the next "
              f"step and exits with code {PREEMPTED_EXIT_CODE}", file=sys.stderr, flush=True)
        if signum is not None:  # the process must not outlive a signal nobody took
            self._fallback = threading.Timer(self._timeout, _terminate, args=(self.rank, signum))
            self._fallback.daemon = True
            self._fallback.start()

    def agreed(self):
        """Whether any rank was given the notice by the last training step (every rank the same)."""
        return self._flags.agreed(PREEMPT)

    def taken(self):
        """The notice was acted on (the backup is written, the process exits): disarmed, no
        fallback termination."""
        if self._fallback is not None:
            self._fallback.cancel()
            self._fallback = None
        self.noticed = False
        self._flags.lower_flag(PREEMPT)
        self.armed = False
        _update_handler()


def _terminate(rank, signum):
    print(f"tfdist: rank {rank}: no training step took the preemption notice within the "
          "timeout: terminating as the signal would have", file=sys.stderr, flush=True)
    os._exit(128 + int(signum))  # pylint: disable=protected-access


def _armed_notices():
    return [notice for notice in list(_notices) if notice.armed]


def _handle(signum, frame):
    armed = _armed_notices()
    if not armed:
        _act_as_before(signum, frame)
        return
    for notice in armed:
        notice.notice(signal.Signals(signum).name, signum)


def _act_as_before(signum, frame=None):
    """What the signal did before tfdist's handler: the previous handler, or its default."""
    previous = _installed.get(signum, signal.getsignal(signum))
    if previous is _handle:
        previous = signal.SIG_DFL
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _update_handler():
    """tfdist's handler while some notice is armed, the previous one otherwise (main thread
    only: ranks simulated as threads are given notices directly)."""
    signum = preemption_signal()
    if signum is None or threading.current_thread() is not threading.main_thread():
        return
    with _install_lock:
        if _armed_notices() and signum not in _installed:
            _installed[signum] = signal.getsignal(signum)
            signal.signal(signum, _handle)
        elif not _armed_notices() and signum in _installed:
            signal.signal(signum, _installed.pop(signum))


def _watch_resize_requests():
    """Under an elastic tfdist-run, watch its resize request (once per process)."""
    with _install_lock:
        if elastic_channel.directory() and not _resize_watcher:
            _resize_watcher.append(watch(elastic_channel.requested_resize,
                                         elastic_channel.POLL_SECONDS))


def watch(check, interval=5.0):
    """Poll `check()` every `interval` seconds on a daemon thread; when it returns True (or a
    reason, a string said with the notice), give every armed rank of this process the notice
    (e.g. a cloud metadata endpoint's answer). Returns the thread."""
    def poll():
        stop = threading.Event()
        while not stop.wait(interval):
            answer = check()
            if answer:
                reason = (answer if isinstance(answer, str)
                          else "a preemption notice from the watcher")
                for notice in _armed_notices():
                    notice.notice(reason)

    thread = threading.Thread(target=poll, name="tfdist-preemption-watcher", daemon=True)
    thread.start()
    return thread
