"""An emulated cluster on one Linux machine: one network namespace per host, shaped links.

Topology: a switch namespace holds a Linux bridge; every host namespace is
joined to it by a veth pair whose host end is `eth0` with address
10.77.0.<i + 1>/24. Each link is shaped in both directions, like a NIC on a
switch port: a token bucket (`tbf`) on the host end shapes what the host
sends, another on the switch end what it receives. Where the kernel has
`netem`, a one-way delay is added on both ends (so the round trip is twice
`delay_ms`); where it has not, the latency is the veth's own (measured by
`benchmarks.link_probe`). Inside each host's namespace this machine's host
name resolves to that host's address, as on a real cluster (a file
/etc/netns/<namespace>/hosts, which `ip netns exec` mounts over /etc/hosts):
Horovod's Gloo binds some of its connections to the address of the host name.

    with EmulatedNetwork(num_hosts=9, rate_mbit=100) as net:
        subprocess.run(net.exec_prefix(0) + ["python", "worker.py"])   # on 10.77.0.1
        net.shape(rate_mbit=400)                                        # every link at once

Hosts can also be told apart as a real cluster's are (`host_names`, `private_dirs`): each
its own host name (a UTS namespace; every namespace's /etc/hosts names all hosts) and its
own disk - each directory of `private_dirs` is, inside a host's processes, that host's own
directory (a bind mount from `<scratch>/<host name>/...` in a mount namespace of its own),
so a file written there on one host is not seen on another, and stays for the host's next
process. `exec_prefix(h)` enters all of it; `benchmarks.netns_ssh` does the same for a
launcher's ssh (`setup_environment`).

Needs root (or CAP_NET_ADMIN) and `ip`/`tc` (iproute2). The network is torn
down on exit from the `with` block and, failing that, at interpreter exit;
namespaces left over by a killed run are removed when the next one starts.
"""

import atexit
import contextlib
import json
import os
import shutil
import socket
import subprocess

PREFIX = "tfdemu"
SWITCH = f"{PREFIX}-sw"
BRIDGE = "br0"
HOST_DEVICE = "eth0"
SUBNET = "10.77.0"
NETNS_ETC = "/etc/netns"  # per-namespace files `ip netns exec` mounts over /etc
# Token bucket: at least this burst (one GSO packet plus headroom), and this much queue.
MIN_BURST_BYTES = 64 * 1024
QUEUE_SECONDS = 0.1


class NetworkUnavailable(RuntimeError):
    """Namespaces or traffic shaping cannot be set up here (not root, no iproute2, ...)."""


def _run(command, check=True):
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise NetworkUnavailable(f"`{' '.join(command)}` failed: {result.stderr.strip()}")
    return result


def _in(namespace, command):
    return ["ip", "netns", "exec", namespace] + command


def check_available():
    """Raise `NetworkUnavailable` with the reason when this process cannot build the network."""
    if os.geteuid() != 0:
        raise NetworkUnavailable("the emulated cluster needs root (network namespaces, veth and "
                                 "tc): run it as root, e.g. `sudo .venv/bin/tfdist-bench "
                                 "--only emulated`.")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise NetworkUnavailable(f"`{tool}` (iproute2) is not installed.")
    try:
        with _scratch_namespace() as probe:
            _run(_in(probe, ["ip", "link", "add", "name", "a", "type", "veth", "peer", "name",
                             "b"]))
            _run(_in(probe, ["tc", "qdisc", "add", "dev", "a", "root", "tbf", "rate", "100mbit",
                             "burst", "64kb", "latency", "100ms"]))
    except NetworkUnavailable as error:
        raise NetworkUnavailable(f"network namespaces with veth and tc tbf are unavailable "
                                 f"here: {error}") from None


def netem_available():
    """True when the kernel has the netem qdisc (needed to add latency)."""
    with _scratch_namespace() as probe:
        return _run(_in(probe, ["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay",
                                "1ms"]), check=False).returncode == 0


@contextlib.contextmanager
def _scratch_namespace():
    """A namespace to try things in, deleted afterwards."""
    name = f"{PREFIX}-probe"
    _run(["ip", "netns", "del", name], check=False)
    try:
        _run(["ip", "netns", "add", name])
        yield name
    finally:
        _run(["ip", "netns", "del", name], check=False)


def _delete_namespace(name):
    _run(["ip", "netns", "del", name], check=False)
    shutil.rmtree(os.path.join(NETNS_ETC, name), ignore_errors=True)


def remove_stale():
    """Delete every namespace (and its /etc/netns files) a previous killed run left behind."""
    listed = _run(["ip", "netns", "list"], check=False).stdout.split()
    on_disk = os.listdir(NETNS_ETC) if os.path.isdir(NETNS_ETC) else []
    for name in set(listed) | set(on_disk):
        if name.startswith(PREFIX):
            _delete_namespace(name)


class EmulatedNetwork:
    """`num_hosts` namespaces on one bridge, every link shaped to `rate_mbit` (see module doc).

    Args:
        num_hosts: hosts 0 .. num_hosts - 1, at 10.77.0.1 .. 10.77.0.num_hosts.
        rate_mbit: bandwidth of every link, in each direction, in Mbit/s.
        delay_ms: one-way delay added on each end of a link where netem exists
            (ignored, and `delay_applied` False, where it does not).
    """

    def __init__(self, num_hosts, rate_mbit, delay_ms=0.0, host_names=None, private_dirs=(),
                 scratch=None):
        if not 1 <= num_hosts <= 250:
            raise ValueError(f"num_hosts must be in 1..250. Got: {num_hosts!r}")
        if host_names is not None and len(host_names) != num_hosts:
            raise ValueError(f"host_names must name {num_hosts} hosts. Got: {host_names!r}")
        if private_dirs and (host_names is None or scratch is None):
            raise ValueError("private_dirs need host_names and a scratch directory")
        self.host_names = list(host_names) if host_names else None
        self.private_dirs = [os.path.abspath(d) for d in private_dirs]
        self.scratch = scratch
        self.num_hosts = num_hosts
        self.rate_mbit = rate_mbit
        self.delay_ms = delay_ms
        self.netem = False
        self._up = False

    def namespace(self, host):
        return f"{PREFIX}{host}"

    def address(self, host):
        return f"{SUBNET}.{host + 1}"

    def exec_prefix(self, host):
        """Command prefix that runs a program on `host` (inside its namespace; with its own
        host name and disk where the network has them)."""
        return ["ip", "netns", "exec", self.namespace(host)] + self._host_setup(host)

    def daemon_prefix(self, host):
        """Like `exec_prefix`, for a daemon that needs the machine's /sys as it is (slurmd
        reads its cgroups there, which `ip netns exec` remounts away): the namespace entered
        with nsenter, its /etc/hosts bound in by hand."""
        namespace = self.namespace(host)
        steps = [f"mount --bind {NETNS_ETC}/{namespace}/hosts /etc/hosts"] + self._steps(host)
        return (["nsenter", f"--net=/run/netns/{namespace}", "unshare", "--uts", "--mount",
                 "--propagation", "private", "sh", "-c", " && ".join(steps) + ' && exec "$@"',
                 "sh"])

    def own_dir(self, host, directory):
        """Where `host`'s own copy of `directory` (one of `private_dirs`) lives."""
        return os.path.join(self.scratch, self.host_names[host],
                            os.path.abspath(directory).lstrip("/"))

    def _host_setup(self, host):
        """`unshare ... sh -c 'hostname; mount --bind ...; exec "$@"' sh` for a host with its
        own name and disk; [] otherwise."""
        if self.host_names is None:
            return []
        return ["unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c",
                " && ".join(self._steps(host)) + ' && exec "$@"', "sh"]

    def _steps(self, host):
        """The shell steps that give `host` its name and its own directories."""
        if self.host_names is None:
            return []
        steps = [f"hostname {self.host_names[host]}"]
        for directory in self.private_dirs:
            own = self.own_dir(host, directory)
            os.makedirs(own, exist_ok=True)
            os.makedirs(directory, exist_ok=True)
            steps.append(f"mount --bind '{own}' '{directory}'")
        return steps

    def setup_environment(self):
        """For `benchmarks.netns_ssh`: {variable: value} that makes its ssh enter each host as
        `exec_prefix` does."""
        hosts = {}
        for host in range(self.num_hosts):
            names = [self.address(host)] + ([self.host_names[host]] if self.host_names else [])
            for name in names:
                hosts[name] = self.namespace(host)
        setup = {self.namespace(h): self._host_setup(h) for h in range(self.num_hosts)}
        return {"TFDIST_EMULATED_HOSTS": ",".join(f"{k}={v}" for k, v in hosts.items()),
                "TFDIST_EMULATED_HOST_SETUP": json.dumps(setup)}

    @property
    def delay_applied(self):
        return self.netem and self.delay_ms > 0

    def __enter__(self):
        check_available()
        remove_stale()
        self.netem = netem_available()
        atexit.register(self.close)
        self._up = True
        try:
            _run(["ip", "netns", "add", SWITCH])
            _run(_in(SWITCH, ["ip", "link", "add", "name", BRIDGE, "type", "bridge"]))
            _run(_in(SWITCH, ["ip", "link", "set", BRIDGE, "up"]))
            for host in range(self.num_hosts):
                self._add_host(host)
            self.shape(self.rate_mbit, self.delay_ms)
        except BaseException:
            self.close()
            raise
        return self

    def _add_host(self, host):
        namespace, port = self.namespace(host), f"p{host}"
        _run(["ip", "netns", "add", namespace])
        _run(_in(namespace, ["ip", "link", "set", "lo", "up"]))
        _run(_in(namespace, ["ip", "link", "add", "name", HOST_DEVICE, "type", "veth", "peer",
                             "name", port, "netns", SWITCH]))
        _run(_in(namespace, ["ip", "addr", "add", f"{self.address(host)}/24", "dev",
                             HOST_DEVICE]))
        _run(_in(namespace, ["ip", "link", "set", HOST_DEVICE, "up"]))
        _run(_in(SWITCH, ["ip", "link", "set", port, "master", BRIDGE]))
        _run(_in(SWITCH, ["ip", "link", "set", port, "up"]))
        etc = os.path.join(NETNS_ETC, namespace)
        os.makedirs(etc, exist_ok=True)
        with open(os.path.join(etc, "hosts"), "w") as f:
            f.write(f"127.0.0.1 localhost\n{self.address(host)} {socket.gethostname()}\n")
            for other, name in enumerate(self.host_names or []):
                f.write(f"{self.address(other)} {name}\n")

    def _link_ends(self):
        for host in range(self.num_hosts):
            yield self.namespace(host), HOST_DEVICE
            yield SWITCH, f"p{host}"

    def shape(self, rate_mbit, delay_ms=0.0):
        """Set every link to `rate_mbit` each way (plus `delay_ms` each end, with netem)."""
        self.rate_mbit, self.delay_ms = rate_mbit, delay_ms
        rate_bytes = rate_mbit * 1e6 / 8
        burst = max(MIN_BURST_BYTES, int(rate_bytes * 0.001))  # and at least 1 ms of rate
        limit = burst + int(rate_bytes * QUEUE_SECONDS)
        tbf = ["tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst), "limit", str(limit)]
        for namespace, device in self._link_ends():
            _run(_in(namespace, ["tc", "qdisc", "del", "dev", device, "root"]), check=False)
            if self.delay_applied:
                _run(_in(namespace, ["tc", "qdisc", "add", "dev", device, "root", "handle", "1:",
                                     "netem", "delay", f"{delay_ms}ms"]))
                _run(_in(namespace, ["tc", "qdisc", "add", "dev", device, "parent", "1:",
                                     "handle", "2:"] + tbf))
            else:
                _run(_in(namespace, ["tc", "qdisc", "add", "dev", device, "root"] + tbf))

    def describe(self):
        """What the links are, for the results."""
        return {
            "hosts": [self.address(h) for h in range(self.num_hosts)],
            "rate_mbit_each_direction": self.rate_mbit,
            "shaping": "tbf on both ends of every veth (host egress and switch egress)",
            "netem_available": self.netem,
            "added_one_way_delay_ms": self.delay_ms if self.delay_applied else 0.0,
            "latency": ("netem delay on both ends" if self.delay_applied else
                        "the veth's native latency (no netem in this kernel)"
                        if not self.netem else "the veth's native latency (no delay asked)"),
        }

    def close(self):
        """Delete every namespace (their veths go with them). Idempotent."""
        if not self._up:
            return
        self._up = False
        for host in range(self.num_hosts):
            _delete_namespace(self.namespace(host))
        _delete_namespace(SWITCH)
        if os.path.isdir(NETNS_ETC) and not os.listdir(NETNS_ETC):
            os.rmdir(NETNS_ETC)

    def __exit__(self, *exc_info):
        self.close()
