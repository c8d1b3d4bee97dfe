"""The key-value store an srun job's ranks swap their addresses through, served by rank 0.

HTTP on one port: `PUT /<scope>/<key>` stores the body, `GET /<scope>/<key>` returns it (404
while absent) - the protocol of Horovod's rendezvous store, so that one client
(`tfdist.comm.address_exchange`) reads both. Unlike Horovod's, it checks the job's secret
(`tfdist.process_setup.job_secret`): every request carries `X-Tfdist-Signature`, the HMAC of
its method, path and body; one without a valid signature is refused (403) and its peer
logged once. Each request is served on a thread of its own and bounded
(`REQUEST_SECONDS`): a connection that sends nothing, or garbage, holds one thread for a
few seconds and answers no one else's request late. Values are at most
`MAX_VALUE_BYTES`. It listens where the job's peers are (`tfdist.comm.ports`): loopback for
a step on one node.
"""

import http.server
import socketserver
import threading

from tfdist.process_setup import job_secret

SIGNATURE_HEADER = "X-Tfdist-Signature"
REQUEST_SECONDS = 3.0
MAX_VALUE_BYTES = 64 * 1024


def signature(secret, method, path, body=b""):
    """The `SIGNATURE_HEADER` value of a request (`job_secret.sign`)."""
    return job_secret.sign(secret, method.encode(), path.encode(), body)


class _Handler(http.server.BaseHTTPRequestHandler):
    timeout = REQUEST_SECONDS

    def _scoped_key(self):
        parts = self.path.split("/")
        if len(parts) != 3 or not parts[1] or not parts[2]:
            self._answer(400)
            return None
        return parts[1], parts[2]

    def _authentic(self, body=b""):
        if job_secret.verify(self.server.secret, self.headers.get(SIGNATURE_HEADER, ""),
                             self.command.encode(), self.path.encode(), body):
            return True
        self.server.refused(self.client_address[0])
        self._answer(403)
        return False

    def _answer(self, code, body=b""):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # pylint: disable=invalid-name
        key = self._scoped_key()
        if key is None or not self._authentic():
            return
        value = self.server.get(key)
        self._answer(404 if value is None else 200, value or b"")

    def do_PUT(self):  # pylint: disable=invalid-name
        key = self._scoped_key()
        if key is None:
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._answer(411)
            return
        if not 0 <= length <= MAX_VALUE_BYTES:
            self._answer(413)
            return
        body = self.rfile.read(length)
        if len(body) != length or not self._authentic(body):
            return
        self.server.put(key, body)
        self._answer(200)

    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        del format, args  # one line per refused peer instead (`AddressStore.refused`)


class AddressStore(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """The store, serving in a daemon thread from construction until `close`.

    Args:
        address: (IP, port) to listen on.
        secret: the job's secret (`job_secret.job_secret`), or None: requests unchecked.
        name: how its log lines name it.
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, secret, name):
        super().__init__(address, _Handler)
        self.secret = secret
        self.name = name
        self._values = {}
        self._lock = threading.Lock()
        self._refusals = job_secret.Refusals(name)
        self._thread = threading.Thread(target=self.serve_forever, name="tfdist-address-store",
                                        daemon=True)
        self._thread.start()

    def get(self, key):
        with self._lock:
            return self._values.get(key)

    def put(self, key, value):
        with self._lock:
            self._values[key] = value

    def refused(self, peer):
        self._refusals.refused(peer)

    def close(self):
        self.shutdown()
        self.server_close()
