"""A Slurm cluster on an emulated network: one slurmd per emulated host, slurmctld on host 0.

    with EmulatedNetwork(2, 1000, host_names=["mhost0", "mhost1"]) as net, \\
            EmulatedSlurm(net, scratch) as slurm:
        subprocess.run(net.exec_prefix(0) + ["srun", "-N", "2", "-n", "2", "hostname"],
                       env=slurm.env(os.environ))

Its own configuration (`slurm.conf` in `scratch`, read through `SLURM_CONF`), state, spool
directories, pid and log files, so it runs beside a Slurm of the machine's own (its daemons
listen in the hosts' namespaces). Each node advertises `cpus` CPUs (config_overrides), no
cgroups are used (proctrack/linuxproc, task/none), munged is the machine's (its socket is a
file: every namespace reaches it). Needs root, Slurm's daemons and a running munged
(`scripts/local_slurm.sh` installs and starts them). The daemons are stopped on exit.
"""

import os
import signal
import subprocess
import time

_CONF = """# Written by benchmarks/netns_slurm.py: the emulated hosts' cluster.
ClusterName=emulated
SlurmctldHost={first}({first_address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={scratch}/state
SlurmdSpoolDir={scratch}/spool-%n
SlurmctldPidFile={scratch}/slurmctld.pid
SlurmdPidFile={scratch}/slurmd-%n.pid
SlurmctldLogFile={scratch}/slurmctld.log
SlurmdLogFile={scratch}/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MailProg=/bin/true
{nodes}
PartitionName=emulated Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmUnavailable(RuntimeError):
    """Slurm's daemons or munge are missing, or the cluster did not come up."""


class EmulatedSlurm:
    """slurmctld on host 0 and a slurmd on every host of `network` (see the module doc)."""

    def __init__(self, network, scratch, cpus=4, timeout=60):
        if network.host_names is None:
            raise ValueError("the emulated Slurm needs hosts with names (host_names)")
        self.network, self.scratch, self.cpus, self.timeout = network, scratch, cpus, timeout
        self.conf = os.path.join(scratch, "slurm.conf")

    def env(self, base):
        """`base` with this cluster's configuration for srun, sinfo, ..."""
        return dict(base, SLURM_CONF=self.conf)

    def __enter__(self):
        for daemon in ("/usr/sbin/slurmctld", "/usr/sbin/slurmd"):
            if not os.access(daemon, os.X_OK):
                raise SlurmUnavailable(f"{daemon} is not installed (scripts/local_slurm.sh)")
        names = self.network.host_names
        os.makedirs(os.path.join(self.scratch, "state"), exist_ok=True)
        for name in names:
            os.makedirs(os.path.join(self.scratch, f"spool-{name}"), exist_ok=True)
        nodes = "\n".join(f"NodeName={name} NodeAddr={self.network.address(h)} "
                          f"CPUs={self.cpus} State=UNKNOWN" for h, name in enumerate(names))
        with open(self.conf, "w") as f:
            f.write(_CONF.format(first=names[0], first_address=self.network.address(0),
                                 scratch=self.scratch, nodes=nodes, names=",".join(names)))
        env = self.env(os.environ)
        try:
            self._start(self.network.exec_prefix(0) + ["/usr/sbin/slurmctld", "-f", self.conf],
                        env)
            for host, name in enumerate(names):
                self._start(self.network.daemon_prefix(host)
                            + ["/usr/sbin/slurmd", "-f", self.conf, "-N", name], env)
            self._wait_idle(env)
        except BaseException:
            self.close()
            raise
        return self

    @staticmethod
    def _start(command, env):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise SlurmUnavailable(f"`{' '.join(command[-5:])}` failed: {done.stderr[-500:]}")

    def _wait_idle(self, env):
        deadline = time.monotonic() + self.timeout
        states = ""
        while time.monotonic() < deadline:
            states = subprocess.run(self.network.exec_prefix(0) + ["sinfo", "-h", "-N", "-o",
                                                                    "%T"],
                                    env=env, capture_output=True, text=True).stdout.split()
            if len(states) == len(self.network.host_names) and all(
                    s in ("idle", "mixed") for s in states):
                return
            time.sleep(0.5)
        logs = ""
        for name in ("slurmctld.log",) + tuple(f"slurmd-{n}.log" for n in
                                               self.network.host_names):
            try:
                with open(os.path.join(self.scratch, name)) as f:
                    logs += f"--- {name}\n" + "".join(f.readlines()[-5:])
            except OSError:
                pass
        raise SlurmUnavailable(f"the emulated Slurm's nodes are {states} after "
                               f"{self.timeout} s\n{logs}")

    def close(self):
        for name in [f"slurmd-{n}.pid" for n in self.network.host_names] + ["slurmctld.pid"]:
            try:
                with open(os.path.join(self.scratch, name)) as f:
                    os.kill(int(f.read().strip()), signal.SIGTERM)
            except (OSError, ValueError):
                continue
        time.sleep(0.5)

    def __exit__(self, *exc_info):
        self.close()
