"""Watch a training process's peers with plain TCP probes, and bound its waits on them.

A daemon thread wakes every `PROBE_INTERVAL_SECONDS` and

* probes the listening port of every peer (`tfdist.launch.ports.unreachable`:
  a TCP connect, no data). A peer whose port refuses the connection (its
  process has exited) or does not answer at all (its machine is down or cut
  off) `PROBES_BEFORE_FAILING` probes in a row is gone;
* checks the waits registered with `waiting()`: a wait with a deadline that
  lasts longer than the job timeout means the peers are alive but out of step.

What a gone peer means depends on whether this process is waiting on its peers:

* waiting (a registered call is in flight, or starts while the peer is gone):
  the peer died under it. The monitor logs an error naming the peer and calls
  `on_failure`, which aborts this process's collectives, so the wait fails
  within seconds with that message;
* not waiting: the peer may simply have finished first - at the end of a job the
  ranks exit seconds apart - so nothing happens. Only if this process is still
  running a timeout later is `on_failure` called (quietly): a wait the monitor
  does not know of (a custom loop's compiled step) must not hang for ever.

The thread itself never calls into TensorFlow except through `on_failure`,
once, when the job is failing: routine probes use sockets only, so nothing
runs beside the training thread's TensorFlow calls (TensorFlow's own
peer-health RPC, `check_collective_ops_peer_health`, used to run every two
seconds here). The thread stops, and is joined, at interpreter exit before
any teardown, and once the main thread has finished.
"""

import atexit
import contextlib
import itertools
import threading
import time

from absl import logging

from tfdist.launch.ports import unreachable

PROBE_INTERVAL_SECONDS = 2.0
PROBES_BEFORE_FAILING = 2
PROBE_TIMEOUT_SECONDS = 2.0


class PeerMonitor:
    """Notices dead peers and stalled waits of one process; see the module docstring.

    Args:
        rank: this process's rank (for messages).
        addresses: "host:port" of every rank's listening server, in rank order.
        timeout: seconds a wait with a deadline may last.
        on_failure: callable(kind, message) that makes pending and future waits
            fail with `message`; kind is "unavailable" (a peer is gone) or
            "deadline" (a wait lasted too long).
    """

    def __init__(self, rank, addresses, timeout, on_failure):
        self.rank = rank
        self.addresses = tuple(addresses)
        self.timeout = float(timeout)
        self._on_failure = on_failure
        self._waits = {}  # token -> (description, start, has_deadline)
        self._tokens = itertools.count()
        self._stop = threading.Event()
        self._failed = False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="tfdist-peer-monitor")
        self._thread.start()
        atexit.register(self.stop)

    @contextlib.contextmanager
    def waiting(self, description, deadline=True):
        """Mark this process as waiting on its peers for the duration of the block.

        With `deadline`, a wait longer than the timeout fails (for calls with no
        timeout of their own); without, the wait only makes a dead peer a failure.
        """
        token = next(self._tokens)
        self._waits[token] = (description, time.monotonic(), deadline)
        try:
            yield
        finally:
            self._waits.pop(token, None)

    def stop(self):
        """Stop watching and wait for the thread (at exit: peers finishing first is fine)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(PROBE_TIMEOUT_SECONDS * len(self.addresses) + 1.0)

    def gone_peers(self):
        """Ranks whose port does not accept connections now (their process is gone)."""
        return [peer for peer, address in enumerate(self.addresses)
                if peer != self.rank and unreachable(address, PROBE_TIMEOUT_SECONDS)]

    # ------------------------------------------------------------ thread
    def _run(self):
        missed = [0] * len(self.addresses)
        gone_since = None
        while not self._stop.wait(PROBE_INTERVAL_SECONDS):
            if not threading.main_thread().is_alive():
                return  # the program has finished: peers exiting now are no failure
            if self._check_waits():
                return
            for peer, address in enumerate(self.addresses):
                if peer != self.rank and not self._stop.is_set():
                    silent = unreachable(address, PROBE_TIMEOUT_SECONDS)
                    missed[peer] = missed[peer] + 1 if silent else 0
            gone = [peer for peer, count in enumerate(missed) if count >= PROBES_BEFORE_FAILING]
            if not gone or self._stop.is_set():
                continue
            gone_since = gone_since or time.monotonic()
            if self._waits or time.monotonic() - gone_since > self.timeout:
                self._peer_gone(gone[0], waiting=bool(self._waits))
                return

    def _check_waits(self):
        now = time.monotonic()
        for description, start, deadline in list(self._waits.values()):
            if deadline and now - start > self.timeout:
                self._fail("deadline", (
                    f"tfdist rank {self.rank}: {description} waited more than the "
                    f"{self.timeout:g} s timeout for its peers, which are alive but not "
                    "taking part: are the ranks out of step (different data or steps per "
                    "epoch), or is a rank stuck outside training?"), report=True)
                return True
        return False

    def _peer_gone(self, peer, waiting):
        """Fail the collectives: `peer` is gone while this rank waits, or has been for long.

        Gone for longer than the timeout with no registered wait, the peer is
        not just finishing first: a call that waits on it without being
        registered (a custom training loop's compiled step) would never return.
        """
        message = (f"tfdist rank {self.rank}: peer rank {peer} ({self.addresses[peer]}) is "
                   "gone (its port does not accept connections)")
        if waiting:
            message += " while this rank was waiting for it; it has probably died"
        else:
            message += f" since more than {self.timeout:g} s; no collective with it can complete"
        self._fail("unavailable", message, report=waiting)

    def _fail(self, kind, message, report):
        if self._failed:
            return
        self._failed = True
        if report:
            logging.error("%s; aborting collectives", message)
        self._on_failure(kind, message)
