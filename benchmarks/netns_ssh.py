"""`ssh` for an emulated cluster: run the command in the namespace of the host it names.

horovodrun reaches every host of `-H` with
    ssh -o PasswordAuthentication=no -o StrictHostKeyChecking=no HOST [-p PORT]
        [-i FILE] [-o ConnectTimeout=S] COMMAND...
(`horovod.runner.util.remote.get_ssh_command`): for the ssh check (`true`),
for its interface probe (`python -m horovod.runner.task_fn ...`) and for each
rank. `install_ssh_shim` puts an `ssh` that runs this module first on PATH;
this module maps HOST to its namespace through the environment variable
`TFDIST_EMULATED_HOSTS` ("10.77.0.1=tfdemu0,10.77.0.2=tfdemu1,...") and runs
    ip netns exec NAMESPACE sh -c 'COMMAND...'
i.e. what sshd would do on that host: the remote shell gets the arguments
joined by spaces. Options are parsed as ssh parses them (those taking a value
skip it); an unknown host is an error, as ssh's would be.
"""

import json
import os
import stat
import sys

HOSTS_ENV = "TFDIST_EMULATED_HOSTS"
SETUP_ENV = "TFDIST_EMULATED_HOST_SETUP"  # {namespace: command prefix} (own name and disk)
# ssh options that take a value (`man ssh`); every other option is a flag.
OPTIONS_WITH_VALUE = set("BbcDEeFIiJLlmOopQRSWw")


def parse(argv):
    """(host, remote command) from ssh's arguments."""
    args = list(argv)
    while args and args[0].startswith("-") and len(args[0]) > 1:
        option = args.pop(0)
        if option == "--":
            break
        if option[1] in OPTIONS_WITH_VALUE and len(option) == 2:
            args.pop(0)  # the value is the next argument (-o Key=Value, -p 22)
    if not args:
        raise SystemExit("ssh (emulated): no host given")
    host, rest = args[0], args[1:]
    # Options may also follow the host (horovodrun puts -p/-i/-o ConnectTimeout there).
    while rest and rest[0].startswith("-") and len(rest[0]) > 1:
        option = rest.pop(0)
        if option[1] in OPTIONS_WITH_VALUE and len(option) == 2:
            rest.pop(0)
    return host.rsplit("@", 1)[-1], " ".join(rest)


def namespaces(environ):
    pairs = [item.split("=", 1) for item in environ.get(HOSTS_ENV, "").split(",") if item]
    return dict(pairs)


def install_ssh_shim(directory):
    """Write `directory`/ssh (runs this module with this interpreter); return the directory."""
    path = os.path.join(directory, "ssh")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nexec {sys.executable} -m benchmarks.netns_ssh \"$@\"\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return directory


def main(argv):
    host, command = parse(argv)
    known = namespaces(os.environ)
    if host not in known:
        print(f"ssh (emulated): no namespace for host {host!r} (known: {sorted(known)})",
              file=sys.stderr)
        return 255
    # The host's own name and disk (`EmulatedNetwork.setup_environment`), where it has them.
    setup = json.loads(os.environ.get(SETUP_ENV) or "{}").get(known[host], [])
    os.execvp("ip", ["ip", "netns", "exec", known[host]] + setup
              + ["sh", "-c", command or "true"])
    return 255  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
