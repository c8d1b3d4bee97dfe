"""The slots an elastic `tfdist-run` may use: Horovod's host discovery script, or a fixed count.

Horovod's format (`horovodrun --host-discovery-script`): the script prints
one line per available host, `hostname:slots`, or `hostname` alone for
`--slots-per-host` slots (default 1); no line means no slots (the hosts are
not ready). It is run through the shell, as Horovod runs it, every
`INTERVAL_SECONDS` (Horovod's frequency) on a daemon thread (`Poller`).

An elastic tfdist-run starts its processes on this machine: only the slots of
hosts that are this machine (by name, or by an address of its own) are
counted. Hosts it cannot start processes on are refused by name - a first
discovery that lists no host of this machine fails the job at once, later
ones are said once and left out (for an elastic job across machines, use
horovodrun --host-discovery-script, which starts processes where the hosts
are; for a fixed job, tfdist-run -H through Open MPI's mpirun).

Cost: one short process per interval in the launcher; nothing in the ranks.
"""

import socket
import subprocess
import sys
import threading
from typing import Dict, Optional

from tfdist.comm import ports

INTERVAL_SECONDS = 1.0
SCRIPT_TIMEOUT_SECONDS = 30.0


def _this_machine():
    names = {"localhost", "127.0.0.1", "::1", "localhost.localdomain"}
    for name in (socket.gethostname, socket.getfqdn):
        try:
            names.add(name())
        except OSError:
            pass
    return names


def is_this_machine(host: str) -> bool:
    """True when `host` names this machine: one of its names, or an address of its own."""
    if host in _this_machine():
        return True
    ip = ports.resolve(host)
    return ip is not None and ports.is_this_machines(ip)


def parse(output: str, slots_per_host: int) -> Dict[str, int]:
    """{host: slots} from a discovery script's output (Horovod's format); ValueError naming the
    line that is neither `host` nor `host:slots`."""
    hosts: Dict[str, int] = {}
    for line in output.splitlines():
        line = line.strip()
        if not line:
            continue
        host, colon, slots = line.partition(":")
        if not colon:
            hosts[host] = slots_per_host
            continue
        try:
            count = int(slots)
        except ValueError:
            count = -1
        if not host or count < 0:
            raise ValueError(f"the host discovery script printed {line!r}: each line must be "
                             "'hostname:slots' (slots an integer >= 0) or 'hostname'")
        hosts[host] = count
    return hosts


class DiscoveryScript:
    """Runs the script and counts its slots (`slots()`; RuntimeError when it fails)."""

    def __init__(self, command: str, slots_per_host: int = 1, log=None):
        self.command = command
        self.slots_per_host = slots_per_host
        self._log = log or (lambda msg: print(f"tfdist-run: {msg}", file=sys.stderr, flush=True))
        self._elsewhere_said = set()
        self._counted = False  # a first count was made (only other machines then: an error)

    def slots(self) -> int:
        try:
            done = subprocess.run(self.command, shell=True, capture_output=True, text=True,
                                  timeout=SCRIPT_TIMEOUT_SECONDS, stdin=subprocess.DEVNULL,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the host discovery script {self.command!r} did not finish "
                               f"within {SCRIPT_TIMEOUT_SECONDS:g} s") from None
        if done.returncode != 0:
            raise RuntimeError(f"the host discovery script {self.command!r} exited with code "
                               f"{done.returncode}: {done.stderr.strip()[-500:]}")
        try:
            hosts = parse(done.stdout, self.slots_per_host)
        except ValueError as error:
            raise RuntimeError(str(error)) from None
        here = {host: slots for host, slots in hosts.items() if is_this_machine(host)}
        elsewhere = sorted(set(hosts) - set(here))
        if elsewhere and not here and not self._counted:
            raise RuntimeError(
                f"the host discovery script lists only other machines ({', '.join(elsewhere)}):"
                " an elastic tfdist-run starts its processes on this machine; for an elastic "
                "job across machines use horovodrun --host-discovery-script")
        said = sorted(set(elsewhere) - self._elsewhere_said)
        if said:
            self._elsewhere_said.update(said)
            self._log(f"the discovery script lists host(s) {', '.join(said)}, which are not this "
                      "machine: their slots are not used (an elastic tfdist-run starts its "
                      "processes on this machine; for processes on other machines use "
                      "horovodrun --host-discovery-script)")
        self._counted = True
        return sum(here.values())


class FixedSlots:
    """No discovery script: the slots are `-np`, always."""

    def __init__(self, slots: int):
        self._slots = slots

    def slots(self) -> int:
        return self._slots


class Poller:
    """Runs `discovery.slots()` every `interval` seconds on a daemon thread; `latest()` is the
    last successful count (None before one). A failing script is said once per message and
    its last count kept (Horovod retries it too)."""

    def __init__(self, discovery, interval: float = INTERVAL_SECONDS, log=None):
        self._discovery, self._interval = discovery, interval
        self._log = log or (lambda msg: print(f"tfdist-run: {msg}", file=sys.stderr, flush=True))
        self._latest: Optional[int] = None
        self._said = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._poll, name="tfdist-host-discovery",
                                        daemon=True)

    def start(self, first: Optional[int] = None):
        self._latest = first
        self._thread.start()
        return self

    def _poll(self):
        while not self._stop.wait(self._interval):
            try:
                slots = self._discovery.slots()
            except RuntimeError as error:
                if str(error) != self._said:
                    self._said = str(error)
                    self._log(f"{error}; the last count of slots is kept")
                continue
            with self._lock:
                self._latest = slots

    def latest(self) -> Optional[int]:
        with self._lock:
            return self._latest

    def stop(self):
        self._stop.set()
