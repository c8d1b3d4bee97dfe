"""The files between `tfdist-run`'s elastic loop and its ranks: a resize request, the last backup.

`tfdist-run --min-np/--max-np` (`tfdist.launch.elastic_job`) gives every
rank `TFDIST_ELASTIC_DIR`, a directory of the job's own, holding:

- `resize_request`: written by the launcher when the job should change size
  (the discovery script reports other slots). Its text is the reason. A rank
  whose `fit` is armed for preemption notices (it has a
  `keras.callbacks.BackupAndRestore`) polls the file every `POLL_SECONDS` on
  a daemon thread (`preemption.watch`) and, seeing it, gives itself the
  notice: every rank backs up after the same training step and exits with
  `restarts.PREEMPTED_EXIT_CODE` (the preemption path), and the launcher
  starts the job again at the new size, which resumes at the next step.
- `backup.json`: written by the chief after each backup (the position:
  epoch, steps of it, optimizer step, processes; or the attributes of
  `hvd.elastic`'s last commit), so that the launcher's resize line says
  where the job resumes.

Both files are replaced whole (written under a temporary name, renamed).
The launcher removes the request before it starts a run.

Cost: one `stat` per process every `POLL_SECONDS` during an armed `fit`; one
small file per backup. TensorFlow-free: the launcher imports it.
"""

import json
import os
from typing import Optional

from tfdist import env_vars

POLL_SECONDS = 0.5
REQUEST_FILE = "resize_request"
BACKUP_FILE = "backup.json"


def directory() -> Optional[str]:
    """This rank's channel directory (None: not started by an elastic tfdist-run)."""
    return env_vars.ELASTIC_DIR.get() or None


def _write(path: str, text: str) -> None:
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(temporary, path)


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


# ------------------------------------------------------------------ the launcher's side
def request_resize(channel: str, reason: str) -> None:
    """Ask the running ranks to back up at an agreed step and exit (`reason`: said by each)."""
    _write(os.path.join(channel, REQUEST_FILE), reason)


def withdraw_request(channel: str) -> None:
    """No resize pending (before a run starts, or when no rank took the request)."""
    try:
        os.remove(os.path.join(channel, REQUEST_FILE))
    except FileNotFoundError:
        pass


def last_backup(channel: str) -> Optional[dict]:
    """The position of the chief's last backup in this job (None: none written yet)."""
    text = _read(os.path.join(channel, BACKUP_FILE))
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


# ---------------------------------------------------------------------- the ranks' side
def requested_resize() -> Optional[str]:
    """The launcher's pending request's reason, read by an armed rank (None: none)."""
    channel = directory()
    return _read(os.path.join(channel, REQUEST_FILE)) if channel else None


def record_backup(position: dict) -> None:
    """The chief wrote a backup at `position` (a no-op outside an elastic tfdist-run)."""
    channel = directory()
    if channel and os.path.isdir(channel):
        _write(os.path.join(channel, BACKUP_FILE), json.dumps(position))
