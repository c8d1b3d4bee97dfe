"""Listening ports: where a process listens, which ports it takes, and holding them until used.

**Where** (`listen_address`): only where the peers are. A job whose processes all run on
this machine listens on loopback (127.0.0.1); a job across machines on the address of the
interface that reaches its peers - the interface named by `TFDIST_NETWORK_INTERFACE`
(tfdist-run's `--network-interface`; Horovod's `HOROVOD_GLOO_IFACE` is read too, as
horovodrun sets it), else the address this process's host name resolves to when it is one
of this machine's own (not a loopback alias such as Debian's 127.0.1.1), else every
interface, which `--verbose` says. The rule is Horovod's `--network-interface` and Open
MPI's `*_if_include`.

**Which** (`reserve_ports`): free ports chosen by the kernel, or taken from a range
(`TFDIST_PORT_RANGE` / `--port-range A-B`, for a firewalled cluster), or consecutive from a
base (`--port-base`).

**Held from choice to use** (`PortReservation`): a chosen port stays bound by the chooser -
not listening, so no connection reaches it - until its user binds it, so no other process
takes it in between (tfdist-run chooses every rank's port seconds before the rank's server
starts). The reservation sets SO_REUSEPORT, which lets a process of the same user bind the
same port beside it (Linux): tfdist's own listeners do (`listening_socket`), TensorFlow's
gRPC server does when `TF_GRPC_REUSE_PORT=1` (`tfdist._tf.start_collective_server` sets
it) and the RPC server of the parameter servers does by gRPC's default. A process of
another user cannot. A port is first bound without SO_REUSEPORT, so that the kernel never
chooses one another socket is using.
"""

import errno
import fcntl
import random
import socket
import struct
from typing import List, Optional, Tuple

from tfdist import env_vars
from tfdist.env_vars import Foreign

LOOPBACK = "127.0.0.1"
EVERY_INTERFACE = ""
_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


class PortReservation:
    """One port held bound (SO_REUSEPORT, not listening) on `host` until `release`.

    Args:
        host: the address to bind ("" for every interface).
        port: the port (0: the kernel's choice of a free one).
    """

    def __init__(self, host: str, port: int = 0):
        self.host = host
        if port == 0:  # the kernel's choice, among ports nobody holds (no SO_REUSEPORT)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((host, 0))
                port = probe.getsockname()[1]
        self._socket = _reuse_port_socket()
        try:
            self._socket.bind((host, port))
        except OSError:
            self._socket.close()
            raise
        self.port = port

    def listening_socket(self, backlog: int = 128) -> socket.socket:
        """The held port as a listening socket of this process (the reservation ends)."""
        sock, self._socket = self._socket, None
        sock.listen(backlog)
        return sock

    def release(self) -> None:
        """Stop holding the port (its user has bound it, or the job is over)."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def _reuse_port_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if hasattr(socket, "SO_REUSEPORT"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


def port_is_free(port, host=LOOPBACK):
    """True if `port` can be bound on `host` right now by this process (a port held by a
    `PortReservation` of this user counts as free: it is held for this process)."""
    with _reuse_port_socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def parse_port_range(text: Optional[str]) -> Optional[Tuple[int, int]]:
    """"A-B" as (A, B), both valid ports, A <= B; None for None or ""; else a ValueError."""
    if not text:
        return None
    try:
        low, high = (int(part) for part in text.split("-", 1))
    except ValueError:
        raise ValueError(f"a port range is 'FIRST-LAST' (e.g. 29500-29599). Got: {text!r}") \
            from None
    if not 0 < low <= high < 65536:
        raise ValueError(f"a port range is 'FIRST-LAST' with 0 < FIRST <= LAST < 65536. "
                         f"Got: {text!r}")
    return low, high


def job_port_range() -> Optional[Tuple[int, int]]:
    """The job's port range (`TFDIST_PORT_RANGE`), or None: any free port."""
    return parse_port_range(env_vars.PORT_RANGE.get())


def reserve_ports(count: int, host: str = LOOPBACK, port_base: Optional[int] = None,
                  port_range: Optional[Tuple[int, int]] = None) -> List[PortReservation]:
    """`count` distinct ports on `host`, held (`PortReservation`): consecutive from
    `port_base` (one in use is an OSError naming it), else free ones in `port_range`
    (too few free is an OSError), else free ones the kernel chooses."""
    held: List[PortReservation] = []
    try:
        if port_base is not None:
            busy = []
            for port in range(port_base, port_base + count):
                try:
                    held.append(PortReservation(host, port))
                except OSError:
                    busy.append(port)
            if busy:
                raise OSError(
                    f"port(s) {busy} on {host or 'every interface'} are already in use; choose "
                    f"another --port-base (the job needs {count} consecutive ports from "
                    f"{port_base}).")
        elif port_range is not None:
            candidates = list(range(port_range[0], port_range[1] + 1))
            random.shuffle(candidates)
            for port in candidates:
                if len(held) == count:
                    break
                try:
                    held.append(PortReservation(host, port))
                except OSError:
                    continue
            if len(held) < count:
                raise OSError(
                    f"only {len(held)} of the {count} ports the job needs are free in the port "
                    f"range {port_range[0]}-{port_range[1]} on {host or 'every interface'} "
                    f"({env_vars.PORT_RANGE.name} / --port-range): widen it")
        else:
            held = [PortReservation(host) for _ in range(count)]
    except BaseException:
        for reservation in held:
            reservation.release()
        raise
    return held


def pick_ports(count, port_base=None, host=LOOPBACK, port_range=None):
    """`count` distinct ports free on `host` now, not held (tests and benchmarks that start
    servers of their own); see `reserve_ports`."""
    held = reserve_ports(count, host, port_base, port_range)
    for reservation in held:
        reservation.release()
    return [reservation.port for reservation in held]


def is_this_machines(ip: str) -> bool:
    """True if `ip` is an address of this machine (it can be bound here)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((ip, 0))
        return True
    except OSError:
        return False


def resolve(host: str) -> Optional[str]:
    """`host`'s IPv4 address ("a.b.c.d" stays itself), or None when it does not resolve."""
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (OSError, IndexError, UnicodeError):
        return None


def interface_address(name: str) -> str:
    """The IPv4 address of network interface `name` (Linux), or a ValueError naming it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR,
                                 struct.pack("256s", name.encode()[:15]))
        except OSError as error:
            reason = ("no such interface" if error.errno == errno.ENODEV
                      else "it has no IPv4 address" if error.errno == errno.EADDRNOTAVAIL
                      else str(error))
            raise ValueError(f"network interface {name!r}: {reason} (`ip addr` lists this "
                             "machine's interfaces)") from None
    return socket.inet_ntoa(packed[20:24])


def network_interface() -> Optional[str]:
    """The interface a multi-host job uses, if named: `TFDIST_NETWORK_INTERFACE`, else
    Horovod's `HOROVOD_GLOO_IFACE` (horovodrun's `--network-interface`)."""
    return (env_vars.NETWORK_INTERFACE.get() or Foreign.HOROVOD_GLOO_IFACE.get() or None)


def listen_address(on_one_host: bool, host: Optional[str] = None) -> str:
    """Where this process listens (module docstring): loopback when every process of the
    job is on this machine; else the named interface's address; else `host`'s address when
    it is this machine's and not loopback; else every interface."""
    if on_one_host:
        return LOOPBACK
    interface = network_interface()
    if interface:
        return interface_address(interface)
    ip = resolve(host) if host else None
    if ip and not ip.startswith("127.") and is_this_machines(ip):
        return ip
    return EVERY_INTERFACE


def advertised_host(on_one_host: bool, host: str) -> str:
    """The host name or address peers are told to reach this process at, where addresses
    are swapped: loopback when every process is on this machine; `TFDIST_HOST` when set;
    the named interface's address when there is one; else `host` (the launcher's name for
    this machine)."""
    if on_one_host:
        return LOOPBACK
    if env_vars.HOST.get():
        return env_vars.HOST.get()
    interface = network_interface()
    return interface_address(interface) if interface else host
