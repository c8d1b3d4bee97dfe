"""What a job listens on: the TCP sockets its processes listen on, read from /proc (Linux).

`tfdist-run --verbose` lists them as they appear (`SocketReport`), one line each with the
process, so an operator sees what a job exposes: on one host every socket of tfdist's
own on loopback, and what the engines open beside it (Open MPI's mpirun, TensorFlow's gRPC
server: the docs' Security page says which listen on every interface and why). Cost: a read
of /proc/net/tcp{,6} and of the job's processes' file descriptors, once a second while
the job runs, only with `--verbose`.
"""

import os
import socket
import struct
import time
from typing import Dict, Iterable, List, NamedTuple, Set

_LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp
_PERIOD_SECONDS = 1.0


class ListeningSocket(NamedTuple):
    address: str  # "127.0.0.1", "0.0.0.0", "::"
    port: int
    pid: int
    process: str  # the command's name

    def describe(self) -> str:
        where = {"0.0.0.0": "every IPv4 interface", "::": "every IPv6 interface"}
        ip = self.address[len("::ffff:"):] if self.address.startswith("::ffff:") else self.address
        scope = where.get(ip, "loopback" if ip.startswith("127.") or ip == "::1"
                          else "one interface")
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port} ({scope}) by {self.process} (pid {self.pid})"


def _hex_address(text: str) -> str:
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(text, 16)))
    words = struct.unpack("<4I", raw)  # /proc prints each 32-bit word in host order
    return socket.inet_ntop(socket.AF_INET6, struct.pack(">4I", *words))


def _listening_inodes() -> Dict[int, tuple]:
    """{socket inode: (address, port)} of every listening TCP socket of this machine."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] != _LISTEN:
                        continue
                    address, port = fields[1].split(":")
                    found[int(fields[9])] = (_hex_address(address), int(port, 16))
        except (OSError, StopIteration, ValueError):
            continue
    return found


def _children() -> Dict[int, List[int]]:
    tree: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def process_tree(root: int) -> List[int]:
    """`root` and every process below it."""
    tree, found, pending = _children(), [], [root]
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(tree.get(pid, []))
    return found


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return "?"


def listening_sockets(pids: Iterable[int]) -> List[ListeningSocket]:
    """The TCP sockets `pids` listen on (those whose descriptors this user may read)."""
    inodes = _listening_inodes()
    found = []
    for pid in pids:
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in descriptors:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = int(target[8:-1])
                if inode in inodes:
                    found.append(ListeningSocket(*inodes[inode], pid, _name(pid)))
    return sorted(set(found), key=lambda s: (s.pid, s.port, s.address))


class SocketReport:
    """Called while a job runs (`ProcessGroup.wait`'s `on_poll`): prints each socket the
    job's processes (this launcher's process tree) start listening on, once."""

    def __init__(self, root: int, print_line):
        self._root = root
        self._print = print_line
        self._seen: Set[tuple] = set()
        self._next = 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + _PERIOD_SECONDS
        for sock in listening_sockets(process_tree(self._root)):
            key = (sock.pid, sock.address, sock.port)
            if key not in self._seen:
                self._seen.add(key)
                self._print(f"listening: {sock.describe()}")
