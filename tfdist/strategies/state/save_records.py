"""A save's completion record: the chief never waits, the other ranks wait for the chief's file.

Scripts save in two conventions, and both must work:

* keras.io's: every rank calls `model.save(path)` (then often loads it back);
* Horovod's: only rank 0 does (`if hvd.rank() == 0: model.save(path)`).

The chief cannot know which convention the script follows, so it never waits
for the others. It writes the file under a temporary name
(`checkpoint_files`), records in the directory's one record file,
`.tfdist-saves`, the fingerprints of the weights it saved
(`replica_consistency`) and the inode the file will have (`publish`), then
renames the file into place. A rank other than the chief writes nothing but
its own state (`rank_state`); it fingerprints its own weights - the same as
the chief's, every rank holding the same weights - and returns once the
record holds them and `path` is that inode (`wait_for`): the chief's file
with these weights is complete, so a load right after reads it. A rank that
calls no save waits for nothing.

Ranks may also save to paths of their own (MultiWorkerMirroredStrategy's
guide: the chief to the model's path, the others to temporary ones they
delete): where the chief has recorded no save of a rank's path, the chief's
save is found through the job's log of completed saves (`JobSaveLog`, in
the temporary directory of the chief's host), which a rank on the chief's
host reads. A job across hosts, which need not share a disk, waits for
the chief's saves through the chief instead (`chief_saves`).

The record is written before the rename, and the file touched after it, so
that the checkpoint, not the record, is the newest entry of its directory (keras.io's scripts resume from
`max(os.listdir(dir), key=os.path.getctime)`); it keeps the latest
`_KEPT` saves of the directory, one hidden file per directory. Where the file
cannot be renamed into place (a remote file system), the record follows the
save and only the fingerprints are compared.

The wait is bounded by the job timeout and fails with what is known: the
chief is gone; the chief saved `path` with other weights (the variables that
differ are named: the ranks disagree); or no such save came (the chief does
not call this save).

Cost: the chief hashes its weights once per save (`replica_consistency`)
and rewrites a small file; another rank hashes its weights and polls the
record (every 20-200 ms) until the chief's file is there.
"""

import contextlib
import json
import os
import random
import socket
import tempfile
import threading
import time
import zlib

import tensorflow as tf

from tfdist.strategies.state import replica_consistency
from tfdist.fault_tolerance.checkpoint_files import write_atomically

_FIRST_POLL_SECONDS = 0.02
_LONGEST_POLL_SECONDS = 0.2


_KEPT = 64  # saves remembered per directory
_unrecorded = threading.local()


@contextlib.contextmanager
def unrecorded():
    """Inside: the chief's saves leave no record (a `BackupAndRestore` backup, which only the
    chief writes and reads)."""
    previous = getattr(_unrecorded, "active", False)
    _unrecorded.active = True
    try:
        yield
    finally:
        _unrecorded.active = previous


def recorded():
    """False inside `unrecorded`."""
    return not getattr(_unrecorded, "active", False)
RECORD_NAME = ".tfdist-saves"


def _split(path):
    path = os.fspath(path).rstrip("/")
    return os.path.split(path)


def record_path(path):
    """The record file of the directory a save to `path` writes into."""
    directory, _ = _split(path)
    return os.path.join(directory, RECORD_NAME)


def _inode(path):
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


class SavedWeights:
    """The fingerprints of the weights a save holds (`replica_consistency`)."""

    def __init__(self, model):
        variables = replica_consistency.compared_variables(model)
        self.names = [replica_consistency.variable_name(v) for v in variables]
        self.fingerprints = replica_consistency.variable_fingerprints(variables)
        self.whole = replica_consistency.whole_fingerprint(self.fingerprints)

    def to_json(self):
        return {"whole": self.whole, "names": self.names, "fingerprints": self.fingerprints}


def publish(path, saved: SavedWeights, written=None):
    """The chief: record that `path` holds `saved`; `written`: the complete file about to be
    renamed to `path` (its inode is recorded), or None once `path` itself is written."""
    directory, name = _split(path)
    entry = dict(saved.to_json(), inode=_inode(written) if written is not None else None)
    records = _read_all(path)
    records.pop(name, None)
    records[name] = entry
    text = json.dumps(dict(list(records.items())[-_KEPT:]))

    def write(temporary):
        with tf.io.gfile.GFile(temporary, "w") as f:
            f.write(text)

    if directory and not tf.io.gfile.exists(directory):
        tf.io.gfile.makedirs(directory)
    write_atomically(write, record_path(path))
    if written is not None:
        _newer_than(written, record_path(path))


def _newer_than(path, other):
    """Touch `path` until its change time is after `other`'s (file systems stamp times with
    a clock of a few milliseconds' resolution: one touch may give the same time)."""
    deadline = time.monotonic() + 1.0
    while True:
        os.utime(path)
        if (os.stat(path).st_ctime_ns > os.stat(other).st_ctime_ns
                or time.monotonic() > deadline):
            return
        time.sleep(0.001)


def _read_all(path):
    try:
        with tf.io.gfile.GFile(record_path(path), "r") as f:
            records = json.loads(f.read())
        return records if isinstance(records, dict) else {}
    except (OSError, ValueError, tf.errors.OpError):
        return {}  # not there yet, or being replaced


def _read(path):
    return _read_all(path).get(_split(path)[1])


def _complete(path, record, saved):
    """The record says `path` holds `saved`, and `path` is the file it describes."""
    if record is None or record.get("whole") != saved.whole:
        return False
    inode = record.get("inode")
    return inode is None or _inode(os.fspath(path).rstrip("/")) == inode


class JobSaveLog:
    """The chief's completed saves of one job, on the chief's host (the latest `_KEPT`, each
    with its number in the chief's sequence of saves), so that a rank saving to a path of
    its own finds the chief's.

    A rank's k-th save is matched with a save of the chief numbered k or later (the chief
    makes every save the others make, and maybe more: a `ModelCheckpoint` only it runs)
    that holds the same weights: an earlier save of the same weights (`save_weights`,
    then `export`) is not taken for it.

    Args:
        key: the job's key, the same on every rank (`agreed`).
        chief_here: this rank runs on the chief's host (it can read the log).
    """

    def __init__(self, key, chief_here):
        self.path = os.path.join(tempfile.gettempdir(), f"tfdist-saves-{key}.json")
        self.chief_here = chief_here
        self.saves = 0  # this rank's saves so far (the chief's: completed)

    @classmethod
    def agreed(cls, communicator):
        """One broadcast from the chief: a random job key and the chief's host name's hash."""
        host = zlib.crc32(socket.gethostname().encode())
        mine = tf.constant([random.SystemRandom().randrange(2**62), host], tf.int64)
        key, chief_host = communicator.broadcast(mine).numpy().tolist()
        return cls(key, chief_host == host)

    def completed(self, saved: SavedWeights):
        """The chief: a save with `saved` is complete."""
        self.saves += 1
        entries = (self._entries() + [[self.saves, saved.whole]])[-_KEPT:]

        def write(temporary):
            with open(temporary, "w", encoding="utf-8") as f:
                json.dump(entries, f)

        write_atomically(write, self.path)

    def requested(self):
        """Another rank: it makes its next save; the number to match."""
        self.saves += 1
        return self.saves

    def holds(self, saved: SavedWeights, number):
        """The chief completed a save numbered `number` or later holding `saved`."""
        return self.chief_here and any(
            index >= number and whole == saved.whole for index, whole in self._entries())

    def _entries(self):
        try:
            with open(self.path, encoding="utf-8") as f:
                entries = json.load(f)
            return entries if isinstance(entries, list) else []
        except (OSError, ValueError):
            return []


def wait_for(path, saved: SavedWeights, what, rank, timeout, chief_gone=lambda: False,
             log=None):
    """Return once the chief has saved `saved`: to `path`, where the chief has recorded a
    save of it; else anywhere, by the job's `log` (`JobSaveLog`). TimeoutError otherwise.
    (A job across hosts waits through `chief_saves` instead.)"""
    deadline = time.monotonic() + timeout
    pause = _FIRST_POLL_SECONDS
    number = log.requested() if log is not None else None
    record = None
    while True:
        record = _read(path)
        if _complete(path, record, saved):
            return
        if record is None and log is not None and log.holds(saved, number):
            return  # the chief keeps no record of this path: its save is elsewhere
        if chief_gone():
            raise TimeoutError(
                f"tfdist rank {rank}: {what} waits for the chief (rank 0) to write "
                f"{os.fspath(path)!r}, but the chief is gone.")
        if time.monotonic() >= deadline:
            break
        time.sleep(pause)
        pause = min(pause * 2, _LONGEST_POLL_SECONDS)
    if record is not None:
        differing = replica_consistency.describe_differences(
            saved.names, saved.fingerprints, record.get("fingerprints", []))
        raise other_weights_error(rank, what, path, timeout, differing)
    raise not_saved_error(rank, what, path, timeout)


def other_weights_error(rank, what, path, timeout, differing=None):
    """The chief saved `path` with other weights than this rank's, and none with these."""
    which = f" ({differing} differ)" if differing else ""
    return replica_consistency.ReplicasDiverged(
        f"tfdist rank {rank}: {what}: the chief's save of {os.fspath(path)!r} holds other "
        f"weights than this rank's{which}, and no save with this rank's came within the "
        f"{timeout:g} s timeout. Either the ranks' weights differ, or the chief does not make "
        "this save (call it on every rank, or on the chief only).")


def not_saved_error(rank, what, path, timeout):
    """The chief made no save of `path` with this rank's weights within the timeout."""
    return TimeoutError(
        f"tfdist rank {rank}: {what} waited {timeout:g} s for the chief (rank 0) to write "
        f"{os.fspath(path)!r}, which it has not. Call a save on every rank (keras.io's way) or "
        "on the chief only (Horovod's: `if rank == 0: model.save(path)`).")
