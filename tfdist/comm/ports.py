"""Listening ports: whether one is free, and free ones for the processes of a job."""

import socket


def port_is_free(port, host="127.0.0.1"):
    """True if `port` can be bound on `host` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def pick_ports(count, port_base=None, host="127.0.0.1"):
    """Return `count` distinct ports free on `host`.

    With `port_base`, the ports are port_base .. port_base + count - 1 and a
    port in use is an error naming it; without, the kernel picks free ports
    (kept bound until all are chosen, so they are distinct).
    """
    if port_base is not None:
        ports = list(range(port_base, port_base + count))
        busy = [p for p in ports if not port_is_free(p, host)]
        if busy:
            raise OSError(
                f"port(s) {busy} on {host} are already in use; choose another --port-base "
                f"(the job needs {count} consecutive ports from {port_base})."
            )
        return ports
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()
