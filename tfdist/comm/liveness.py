"""Liveness: is a peer process still there, and is a wait on the peers still making progress?

The one place where tfdist decides that another process of the job is gone,
shared by TensorFlow's collectives (`PeerMonitor`), the parameter-server
workers watching their servers and the servers watching their workers
(`ProbeCounter`). All of it uses plain TCP connects, never TensorFlow: a
probe runs beside training without touching its runtime.

* `connection_refused(address)`: nothing listens on the port any more - the
  process behind it has exited (its machine still answers);
* `unreachable(address)`: refused, or no answer at all - the process has
  exited, or its machine is down or cut off;
* `ProbeCounter`: an address is gone after `PROBES_BEFORE_FAILING`
  failed probes in a row (one failed connect is not enough evidence);
* `PeerMonitor`: a daemon thread over a process's collective peers.

The monitor wakes every `PROBE_INTERVAL_SECONDS` and

* probes every peer (`unreachable`);
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
once, when the job is failing (TensorFlow's own peer-health RPC,
`check_collective_ops_peer_health`, used to run every two seconds here).
Its owner stops it (`stop()`) before the process's other resources shut
down (`tfdist.runtime`); it also stops once the main thread has finished.

Cost: one TCP connect per peer every `PROBE_INTERVAL_SECONDS`, no data.
"""

import contextlib
import errno
import itertools
import os
import socket
import sys
import threading
import time

from absl import logging

from tfdist.process_setup import job_secret
from tfdist.process_setup.cluster import validate_address

PROBE_INTERVAL_SECONDS = 2.0
PROBES_BEFORE_FAILING = 2
PROBE_TIMEOUT_SECONDS = 2.0


def ending_the_process(engine):
    """An `on_failure` for an engine that cannot abort its collectives (Horovod, MPI): the
    message, then the process ends (exit code 1) and the launcher stops the other ranks."""

    def end(kind, message):
        del kind
        print(f"{message}; {engine} cannot abort its collectives: this process ends "
              "(exit code 1)", file=sys.stderr, flush=True)
        os._exit(1)  # pylint: disable=protected-access

    return end


def connection_refused(address, timeout=PROBE_TIMEOUT_SECONDS):
    """True if nothing listens on "host:port" any more: the process behind it is gone.

    A liveness probe only (no data is sent): a slow or busy process still
    accepts connections, a dead one's port refuses them.
    """
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


REFUSED = "refused"
SILENT = "silent"
NO_ROUTE = "no route"
# How each failed probe is said: a refused connection means the process is gone (its host
# answers), silence or no route means the host or the link to it.
PROBE_FAILURES = {
    REFUSED: "its port refuses connections: the process has exited or died",
    SILENT: "its host does not answer: the host is down or the network link to it is cut",
    NO_ROUTE: "no route to its host: the host is down or the network link to it is cut",
}


def probe_failure(address, timeout=PROBE_TIMEOUT_SECONDS, token=b""):
    """None if something accepts connections on "host:port", else how the probe failed:
    `REFUSED`, `SILENT` (no answer within `timeout`) or `NO_ROUTE`. `token`: sent once
    connected (a `LivenessPort` of the job logs a peer that sends anything else).

    The kernel accepts connections for a live process however busy that process is,
    so silence within `timeout` means the host or the network, not a slow process.
    A malformed address is a ValueError (addresses are checked where they arrive).
    """
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as connection:
            if token:
                with contextlib.suppress(OSError):
                    connection.sendall(token)
            return None
    except ConnectionRefusedError:
        return REFUSED
    except socket.timeout:
        return SILENT
    except OSError as e:
        if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN):
            return NO_ROUTE
        return None  # anything else (too many open files, ...) is no evidence


def unreachable(address, timeout=PROBE_TIMEOUT_SECONDS):
    """True if nothing answers on "host:port": the connection is refused, or not answered.

    Stricter than `connection_refused`: a machine that is down or cut off does
    not refuse connections, it stays silent.
    """
    return probe_failure(address, timeout) is not None


class LivenessPort:
    """A listening socket that tells a peer's `PeerMonitor` this process is still there: it
    accepts every connection and closes it, answering nothing. A connection that sends
    something other than the job's token (`token`, what this job's probes send) is a
    stranger's: refused and logged, once per peer address; the job goes on. Each
    connection is read for at most `READ_SECONDS`.

    Args:
        held: the `tfdist.comm.ports.PortReservation` of the port (bound where the peers are).
        token: what this job's probes send (`job_secret.token`; b"" without a secret).
        name: how the log names it.
    """

    READ_SECONDS = 0.5

    def __init__(self, held, token, name):
        self._socket = held.listening_socket()
        self._token = token
        self._refusals = job_secret.Refusals(name)
        self._thread = threading.Thread(target=self._accept, daemon=True,
                                        name="tfdist-liveness-port")
        self._thread.start()

    def _accept(self):
        while True:
            try:
                connection, peer = self._socket.accept()
            except OSError:  # closed
                return
            with connection:
                self._check(connection, peer[0])

    def _check(self, connection, peer):
        connection.settimeout(self.READ_SECONDS)
        try:
            sent = connection.recv(len(self._token) + 1)
        except OSError:  # nothing within the time (a connect-only probe), or reset
            return
        if sent and sent != self._token:
            self._refusals.refused(peer)

    def close(self):
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()


class ProbeCounter:
    """Which of `addresses` are gone: `PROBES_BEFORE_FAILING` failed probes in a row.

    Args:
        addresses: "host:port" to probe, by index.
        probe: callable(address, timeout) -> True if the probe failed
            (`unreachable` or `connection_refused`), or how it failed (`probe_failure`).
    """

    def __init__(self, addresses, probe):
        self.addresses = tuple(addresses)
        self._probe = probe
        self._missed = [0] * len(self.addresses)
        self.failures = [None] * len(self.addresses)  # how each address's last probe failed

    def probe(self, indices=None):
        """Probe `indices` (default: all) once; return the indices that are gone."""
        for index in range(len(self.addresses)) if indices is None else indices:
            failed = self._probe(self.addresses[index], PROBE_TIMEOUT_SECONDS)
            self._missed[index] = self._missed[index] + 1 if failed else 0
            self.failures[index] = failed or None
        return [i for i, count in enumerate(self._missed) if count >= PROBES_BEFORE_FAILING]


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

    def __init__(self, rank, addresses, timeout, on_failure, token=b""):
        for peer, address in enumerate(addresses):
            validate_address(address, f"tfdist rank {rank}: the address of rank {peer}")
        self.rank = rank
        self.addresses = tuple(addresses)
        self.timeout = float(timeout)
        self._on_failure = on_failure
        self._token = token  # sent by each probe (the peers' `LivenessPort`s check it)
        self._waits = {}  # token -> (description, start, has_deadline)
        self._tokens = itertools.count()
        self._stop = threading.Event()
        self._failed = False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="tfdist-peer-monitor")
        self._thread.start()

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
        return list(self.peer_failures())

    def peer_failures(self):
        """{rank: how its probe failed (`PROBE_FAILURES`)} of the peers that are gone or
        unreachable now."""
        failures = {peer: probe_failure(address, PROBE_TIMEOUT_SECONDS, self._token)
                    for peer, address in enumerate(self.addresses) if peer != self.rank}
        return {peer: failure for peer, failure in failures.items() if failure is not None}

    # ------------------------------------------------------------ thread
    def _run(self):
        try:
            self._watch()
        except Exception as error:  # pylint: disable=broad-except
            # A monitor that dies silently leaves every wait unbounded: say so, loudly.
            logging.error("tfdist rank %d: the peer monitor stopped on an unexpected error "
                          "(%s: %s); waits on the peers are no longer bounded by the "
                          "timeout", self.rank, type(error).__name__, error)

    def _watch(self):
        peers = [peer for peer in range(len(self.addresses)) if peer != self.rank]
        probes = ProbeCounter(self.addresses,
                              lambda address, timeout: probe_failure(address, timeout,
                                                                     self._token))
        gone_since = None
        while not self._stop.wait(PROBE_INTERVAL_SECONDS):
            if not threading.main_thread().is_alive():
                return  # the program has finished: peers exiting now are no failure
            if self._check_waits():
                return
            gone = probes.probe(peers)
            if not gone or self._stop.is_set():
                continue
            gone_since = gone_since or time.monotonic()
            if self._waits or time.monotonic() - gone_since > self.timeout:
                self._peer_gone(gone[0], probes.failures[gone[0]], waiting=bool(self._waits))
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

    def _peer_gone(self, peer, failure, waiting):
        """Fail the collectives: `peer` is gone while this rank waits, or has been for long.

        `failure`: how its last probe failed (`PROBE_FAILURES`). Gone for longer than
        the timeout with no registered wait, the peer is not just finishing first: a call
        that waits on it without being registered (a custom training loop's compiled
        step) would never return.
        """
        gone = "unreachable" if failure in (SILENT, NO_ROUTE) else "gone"
        message = (f"tfdist rank {self.rank}: peer rank {peer} ({self.addresses[peer]}) is "
                   f"{gone} ({PROBE_FAILURES.get(failure, PROBE_FAILURES[REFUSED])})")
        if waiting:
            waits = "; ".join(sorted({d for d, _, _ in list(self._waits.values())}))
            message += f" while this rank was waiting for it ({waits})"
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
