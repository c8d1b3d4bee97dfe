"""Check an emulated link without TensorFlow: TCP throughput and round-trip time.

    python -m benchmarks.link_probe serve PORT                 # echo pings, swallow bulk data
    python -m benchmarks.link_probe bulk HOST PORT BYTES       # prints MB/s sent
    python -m benchmarks.link_probe rtt HOST PORT ROUNDS       # prints median RTT in seconds

Run each side inside its host's namespace (`EmulatedNetwork.exec_prefix`).
`probe_link` does both for two hosts of a network and returns the numbers.
"""

import socket
import statistics
import subprocess
import sys
import time

PING = b"p"
CHUNK = 1 << 16


def serve(port):
    """Accept connections forever: a 1-byte message is echoed, anything longer is read away."""
    listener = socket.create_server(("", port))
    while True:
        connection, _ = listener.accept()
        with connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                data = connection.recv(CHUNK)
                if not data:
                    break
                if data == PING:
                    connection.sendall(PING)


def bulk(host, port, nbytes):
    """Seconds to send `nbytes` (until the receiver has read them all: it closes after us)."""
    payload = b"x" * CHUNK
    with socket.create_connection((host, port)) as connection:
        start = time.perf_counter()
        sent = 0
        while sent < nbytes:
            connection.sendall(payload)
            sent += len(payload)
        connection.shutdown(socket.SHUT_WR)
        connection.recv(1)  # returns when the server has drained and closed
        return time.perf_counter() - start, sent


def rtt(host, port, rounds):
    with socket.create_connection((host, port)) as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            connection.sendall(PING)
            connection.recv(1)
            times.append(time.perf_counter() - start)
        return statistics.median(times)


def probe_link(network, server_host, client_host, port=47000, nbytes=8 << 20):
    """{"throughput_MBps", "rtt_s"} from `client_host` to `server_host` of an EmulatedNetwork."""
    here = [sys.executable, "-m", "benchmarks.link_probe"]
    server = subprocess.Popen(network.exec_prefix(server_host) + here + ["serve", str(port)])
    try:
        address = network.address(server_host)
        for _ in range(50):  # until the server listens
            probe = subprocess.run(network.exec_prefix(client_host) + here + [
                "rtt", address, str(port), "20"], capture_output=True, text=True, check=False)
            if probe.returncode == 0:
                break
            time.sleep(0.1)
        rtt_s = float(probe.stdout)
        out = subprocess.run(network.exec_prefix(client_host) + here + [
            "bulk", address, str(port), str(nbytes)], capture_output=True, text=True, check=True)
        return {"throughput_MBps": float(out.stdout), "rtt_s": rtt_s}
    finally:
        server.kill()
        server.wait()


def main(argv):
    mode = argv[1]
    if mode == "serve":
        serve(int(argv[2]))
    elif mode == "bulk":
        seconds, sent = bulk(argv[2], int(argv[3]), int(argv[4]))
        print(sent / seconds / 1e6)
    elif mode == "rtt":
        print(rtt(argv[2], int(argv[3]), int(argv[4])))
    else:
        raise SystemExit(f"unknown mode {mode!r}: serve, bulk or rtt")


if __name__ == "__main__":
    main(sys.argv)
