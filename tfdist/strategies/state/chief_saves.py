"""Saves on hosts without a shared disk: every rank that asked for a file gets the chief's bytes.

A save that every rank calls (keras.io's `model.save(path)`, a `ModelCheckpoint` on every
rank) is written by the chief alone (`keras_patches.saving`); on one machine, or where the
hosts share the path's file system, the other ranks then find the chief's file
(`save_records`). Where each host has its own disk (Kubernetes pods, most clusters' local
scratch), a rank on another host would find nothing at the path, or an older file - and
load stale weights without a word. So in a job across hosts (`Cluster.on_one_host` false):

* the chief serves its completed saves (`ChiefSaveService`: HTTP on one port where the
  peers are, every request signed with the job's secret as the address store's,
  `tfdist.comm.address_store`; a request without it is refused and logged): for each, its
  path, the save's number in
  the chief's sequence, the weights' fingerprint (`save_records.SavedWeights`) and a
  manifest of the bytes written - every file (one for `.keras`, `.weights.h5`, `.h5`; a
  SavedModel directory's files for `export`) with its size, modification time and
  SHA-256. The chief never waits for anyone;
* another rank that saves (`ChiefSaveClient.fetch`) asks the chief for its save of the same
  path with the same weights (or, where the chief saved them elsewhere - a rank saving to a
  path of its own, MultiWorkerMirroredStrategy's guide - that one, after a grace of
  `ELSEWHERE_GRACE_SECONDS` in which the chief's save of this path may still complete);
  once the chief has
  completed it, the rank compares the manifest with its own disk: where the path is the
  chief's file (a shared file system: same size and time, else same SHA-256) nothing
  moves; else it copies the chief's bytes in pieces of `PIECE_BYTES`, checks their SHA-256,
  and renames them into place (a directory is replaced whole). Only the files of the
  chief's completed saves are served. A remote path
  (`scheme://...`) is shared by nature: only the completion is awaited. So every rank
  returns with the chief's bytes at its path, or fails: the chief's save holds other
  weights (`ReplicasDiverged`), no such save comes within the timeout, or the chief is gone;
* the chief's service stays up at exit until every other rank said goodbye (its own exit,
  `close`), is gone, or the job timeout passed: a rank that saves and exits right after the
  chief still gets the file.

Cost: the chief hashes what it wrote once per save (about the time a local write takes);
another rank hashes its own copy where it is not the chief's file by size and time, and
moves the bytes only where its disk does not hold them: one request per 4 MiB piece.
"""

import hashlib
import http.server
import json
import os
import shutil
import socketserver
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import List, NamedTuple, Optional

from absl import logging

from tfdist import env_vars
from tfdist.comm import ports
from tfdist.comm.address_store import SIGNATURE_HEADER, signature
from tfdist.errors import ClusterError
from tfdist.fault_tolerance.checkpoint_files import writer_tag
from tfdist.process_setup import job_secret
from tfdist.strategies.state import save_records

PIECE_BYTES = 4 * 1024 * 1024  # one request's bytes
REQUEST_SECONDS = 15.0  # a request's own bound (a copy takes one per piece)
ELSEWHERE_GRACE_SECONDS = 3.0  # before the chief's save to another path is taken for this one
_KEPT = 64  # saves the chief remembers
_POLL_SECONDS = (0.02, 0.2)  # first and longest pause between queries
PENDING, DONE, OTHER_WEIGHTS = 0, 1, 2


class _Save(NamedTuple):
    number: int
    whole: int  # the weights' fingerprint
    path: str
    manifest: list  # [[relative path, size, mtime_ns, sha256], ...]; "" for the file itself


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest(path: str) -> list:
    """[[relative path, size, mtime_ns, sha256]] of the file `path`, or of every file of the
    directory `path` (relative paths sorted)."""
    if os.path.isdir(path):
        files = sorted(os.path.relpath(os.path.join(root, name), path)
                       for root, _, names in os.walk(path) for name in names)
    else:
        files = [""]
    entries = []
    for relative in files:
        full = os.path.join(path, relative) if relative else path
        stat = os.stat(full)
        entries.append([relative, stat.st_size, stat.st_mtime_ns, _sha256(full)])
    return entries


def holds(path: str, entries: list) -> bool:
    """True when `path` on this host holds the files of `entries` (a `manifest`): each of the
    same size and modification time (the same file, seen through a shared file system), or
    of the same SHA-256."""
    try:
        is_directory = os.path.isdir(path)
        if is_directory != (entries[0][0] != ""):
            return False
        if is_directory and len(manifest_names(path)) != len(entries):
            return False
        for relative, size, mtime_ns, sha in entries:
            full = os.path.join(path, relative) if relative else path
            stat = os.stat(full)
            if stat.st_size != size:
                return False
            if stat.st_mtime_ns != mtime_ns and _sha256(full) != sha:
                return False
        return True
    except OSError:
        return False


def manifest_names(path: str) -> List[str]:
    return [os.path.join(root, name) for root, _, names in os.walk(path) for name in names]


class _Handler(http.server.BaseHTTPRequestHandler):
    """The service's three requests, each signed with the job's secret
    (`tfdist.comm.address_store.signature` of method, path and body):
    GET /query?path&whole&number (JSON), GET /read?path&relative&offset&length (bytes),
    POST /goodbye?rank."""

    timeout = REQUEST_SECONDS

    def _authentic(self, body=b""):
        if job_secret.verify(self.server.secret, self.headers.get(SIGNATURE_HEADER, ""),
                             self.command.encode(), self.path.encode(), body):
            return True
        self.server.owner.refused(self.client_address[0])
        self._answer(403)
        return False

    def _answer(self, code, body=b"", kind="application/octet-stream"):
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _arguments(self):
        url = urllib.parse.urlsplit(self.path)
        return url.path, {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}

    def do_GET(self):  # pylint: disable=invalid-name
        if not self._authentic():
            return
        route, arguments = self._arguments()
        owner = self.server.owner
        try:
            if route == "/query":
                state, save = owner.find(arguments["path"], int(arguments["whole"]),
                                         int(arguments["number"]))
                reply = {"state": state}
                if save is not None:
                    reply.update(path=save.path, manifest=save.manifest)
                self._answer(200, json.dumps(reply).encode(), "application/json")
            elif route == "/read":
                self._answer(200, owner.read(arguments["path"], arguments.get("relative", ""),
                                             int(arguments["offset"]),
                                             int(arguments["length"])))
            else:
                self._answer(404)
        except (KeyError, ValueError, OSError) as error:
            self._answer(400, str(error).encode(), "text/plain")

    def do_POST(self):  # pylint: disable=invalid-name
        body = self.rfile.read(min(int(self.headers.get("Content-Length") or 0), 1024))
        if not self._authentic(body):
            return
        route, arguments = self._arguments()
        if route == "/goodbye" and arguments.get("rank", "").isdigit():
            self.server.owner.goodbye(int(arguments["rank"]))
            self._answer(200)
        else:
            self._answer(400)

    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        del format, args


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


class ChiefSaveService:
    """The chief's completed saves, served to the other hosts (module docstring).

    Args:
        held_port: the `tfdist.comm.ports.PortReservation` to serve on (bound where the
            peers are).
        world_size: the job's ranks (those that say goodbye at exit).
        timeout: the longest the service waits at exit for the other ranks.
        gone_peers: () -> ranks whose process is gone (their goodbye is not awaited).
    """

    def __init__(self, held_port, world_size, timeout, gone_peers):
        self._lock = threading.Lock()
        self._saves: List[_Save] = []
        self._goodbyes = set()
        self._refusals = job_secret.Refusals("the chief's save service")
        self._world_size = world_size
        self._timeout = timeout
        self._gone_peers = gone_peers
        self.port = held_port.port
        self._server = _Server(("", 0), _Handler, bind_and_activate=False)
        self._server.socket.close()
        self._server.socket = held_port.listening_socket()
        self._server.server_address = self._server.socket.getsockname()
        self._server.secret = job_secret.job_secret()
        self._server.owner = self
        threading.Thread(target=self._server.serve_forever, name="tfdist-chief-saves",
                         daemon=True).start()

    # ------------------------------------------------------------ the chief's side
    def completed(self, path: str, whole: int, number: int) -> None:
        """The chief's save number `number` of weights `whole` to `path` is complete."""
        path = os.fspath(path)
        entries = [["", 0, 0, ""]] if "://" in path else manifest(path)  # remote: shared
        with self._lock:
            self._saves = (self._saves + [_Save(number, whole, path, entries)])[-_KEPT:]

    def close(self) -> None:
        """Serve until every other rank said goodbye, is gone, or the timeout passed."""
        deadline = time.monotonic() + self._timeout
        waiting = set(range(1, self._world_size))
        try:
            while time.monotonic() < deadline:
                with self._lock:
                    waiting -= self._goodbyes
                if waiting:
                    waiting -= set(self._gone_peers())
                if not waiting:
                    return
                time.sleep(0.5)
            logging.warning("tfdist: the chief's save service stopped waiting for ranks %s "
                            "after the %g s timeout", sorted(waiting), self._timeout)
        finally:
            self._server.shutdown()
            self._server.server_close()

    # ------------------------------------------------------------ served requests
    def find(self, path, whole, number):
        """(state, save) for a rank's save number `number` of `whole` to `path`: the chief's
        save of these weights numbered `number` or later, at `path` if there is one."""
        with self._lock:
            saves = [s for s in self._saves if s.number >= number]
        matching = [s for s in saves if s.whole == whole]
        for save in reversed(matching):
            if save.path == path:
                return DONE, save
        if matching:
            return DONE, matching[-1]
        if any(s.path == path for s in saves):
            return OTHER_WEIGHTS, None
        return PENDING, None

    def read(self, path, relative, offset, length):
        """`length` bytes at `offset` of a file the chief saved (no other file is served)."""
        with self._lock:
            known = any(s.path == path and any(e[0] == relative for e in s.manifest)
                        for s in self._saves)
        if not known:
            raise ValueError(f"the chief serves only its completed saves, not {path!r} "
                             f"{relative!r}")
        with open(os.path.join(path, relative) if relative else path, "rb") as f:
            f.seek(offset)
            return f.read(min(length, PIECE_BYTES))

    def goodbye(self, rank):
        with self._lock:
            self._goodbyes.add(rank)

    def refused(self, peer):
        self._refusals.refused(peer)


class ChiefSaveClient:
    """Another rank's side of the chief's saves (module docstring).

    Args:
        address: "host:port" of the chief's `ChiefSaveService`.
        rank: this rank (messages, goodbye).
        timeout: seconds a save may wait for the chief's.
    """

    def __init__(self, address, rank, timeout):
        self.address = address
        self.rank = rank
        self.timeout = timeout
        self._secret = job_secret.job_secret()

    def fetch(self, path, saved, what: str, number: int, chief_gone) -> None:
        """Return once `path` on this host holds the chief's save of `saved` (the weights'
        `save_records.SavedWeights`), this rank's save number `number`; see the module
        docstring for what fails."""
        path = os.fspath(path)
        deadline = time.monotonic() + self.timeout
        pause = _POLL_SECONDS[0]
        reply = {"state": PENDING}
        elsewhere_since = None
        while True:
            try:
                reply = json.loads(self._request("GET", "/query", path=path, whole=saved.whole,
                                                 number=number))
            except OSError as error:  # not answering now: the chief may be gone
                logging.log_first_n(logging.INFO, "tfdist rank %d: the chief's save service "
                                    "did not answer (%s)", 1, self.rank, error)
            if reply["state"] == DONE and reply["path"] != path:
                # The chief's save of these weights to another path: this rank's own path
                # (MultiWorkerMirroredStrategy's guide) - unless the chief's save of this one
                # is still being written: taken after a grace.
                elsewhere_since = elsewhere_since or time.monotonic()
                if time.monotonic() - elsewhere_since < ELSEWHERE_GRACE_SECONDS:
                    reply = {"state": PENDING}
            if reply["state"] == DONE:
                self._make_local(path, reply)
                return
            if chief_gone():
                raise TimeoutError(
                    f"tfdist rank {self.rank}: {what} waits for the chief (rank 0) to save "
                    f"{path!r}, but the chief is gone.")
            if time.monotonic() >= deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, _POLL_SECONDS[1])
        if reply["state"] == OTHER_WEIGHTS:
            raise save_records.other_weights_error(self.rank, what, path, self.timeout)
        raise save_records.not_saved_error(self.rank, what, path, self.timeout)

    def close(self) -> None:
        """Tell the chief this rank needs no more of its saves (at exit)."""
        try:
            self._request("POST", "/goodbye", rank=self.rank)
        except OSError:
            pass  # the chief is gone already: nothing to say goodbye to

    def _request(self, method, route, **arguments):
        """One signed request to the service; its reply's body (an OSError when it fails)."""
        target = f"{route}?{urllib.parse.urlencode(arguments)}"
        body = b"" if method == "POST" else None
        request = urllib.request.Request(
            f"http://{self.address}{target}", data=body, method=method,
            headers={SIGNATURE_HEADER: signature(self._secret, method, target, body or b"")})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_SECONDS * 4) as answer:
                return answer.read()
        except urllib.error.HTTPError as error:
            if error.code == 403:
                raise ClusterError(
                    f"tfdist rank {self.rank}: the chief's save service ({self.address}) "
                    f"refused this rank's request: the ranks hold different "
                    f"{env_vars.SECRET} values - give every process the same one, or none"
                ) from None
            raise OSError(f"the chief's save service answered {error.code}: "
                          f"{error.read()[:200]!r}") from None

    def _make_local(self, path, reply):
        """`path` holds the chief's bytes of `reply` (its path and manifest), copied if not."""
        entries = reply["manifest"]
        if "://" in path or "://" in reply["path"] or holds(path, entries):
            return
        directory, name = os.path.split(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        staging = os.path.join(directory, f".{name}.tfdist-fetch-{writer_tag()}")
        previous = staging + "-previous"
        _remove(staging)
        try:
            for relative, size, mtime_ns, sha in entries:
                target = os.path.join(staging, relative) if relative else staging
                if relative:
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                self._copy(reply["path"], relative, size, sha, target)
                os.utime(target, ns=(mtime_ns, mtime_ns))
            if entries[0][0] and os.path.lexists(path):  # a directory is not replaced in
                os.replace(path, previous)              # one rename
            os.replace(staging, path)
        finally:
            _remove(staging)
            _remove(previous)
        logging.info("tfdist rank %d: copied the chief's save of %s from %s (this host does "
                     "not share the chief's disk there)", self.rank, path, self.address)

    def _copy(self, chief_path, relative, size, sha, target):
        digest = hashlib.sha256()
        offset = 0
        with open(target, "wb") as out:
            while offset < size:
                piece = self._request("GET", "/read", path=chief_path, relative=relative,
                                      offset=offset, length=PIECE_BYTES)
                if not piece:
                    break
                out.write(piece)
                digest.update(piece)
                offset += len(piece)
        if offset != size or digest.hexdigest() != sha:
            raise OSError(f"tfdist rank {self.rank}: the copy of the chief's {chief_path!r} "
                          f"{relative!r} is not the chief's ({offset} of {size} bytes, SHA-256 "
                          "differs): it changed while it was copied")


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def agreed(cluster, communicator) -> Optional[object]:
    """At the strategy's start, every rank together: in a job across hosts the chief starts
    its `ChiefSaveService` and tells every rank its address; returns the chief's service,
    another rank's `ChiefSaveClient`, or None for a job on one host (its disk is shared)."""
    if cluster.on_one_host or cluster.world_size == 1:
        return None
    own = ""
    service = None
    if cluster.is_chief:
        host = _chief_host(cluster)
        held = ports.reserve_ports(1, ports.listen_address(False, host),
                                   port_range=ports.job_port_range())[0]
        service = ChiefSaveService(held, cluster.world_size, cluster.timeout,
                                   communicator.gone_peers)
        own = f"{host}:{service.port}"
    address = communicator.all_gather_strings(own, max_bytes=512)[0]
    return service or ChiefSaveClient(address, cluster.rank, cluster.timeout)


def _chief_host(cluster):
    """The host name or address the other ranks reach the chief by: its worker address's,
    where the launcher gave or the ranks swapped them, else `ports.advertised_host`'s."""
    import socket  # pylint: disable=import-outside-toplevel

    if cluster.worker_addresses:
        return cluster.worker_addresses[cluster.rank].rsplit(":", 1)[0]
    return ports.advertised_host(False, cluster.host or socket.gethostname())
