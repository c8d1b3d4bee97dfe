"""One rank of `tfdist-run`'s MPI job (`tfdist.launch.mpi_job`): mpirun's rank as tfdist-run's,
then the command, its output lines tagged with the rank.

    python -m tfdist.launch.mpi_rank <command> [args...]

mpirun gives every process the same environment and its rank in OMPI_COMM_WORLD_RANK;
tfdist-run's processes read theirs from TFDIST_RANK and TFDIST_LOCAL_RANK (one host: the
same), Horovod on Gloo from HOROVOD_RANK and HOROVOD_LOCAL_RANK: tfdist-run names those in
TFDIST_RANK_VARIABLES (`mpi_job.environment`). This sets each to the rank and runs the
command as its child, which joins the MPI job as the rank (Open MPI identifies it by the environment mpirun gave, as for `mpirun sh script.sh`).
The child's output is relayed whole line by whole line, each prefixed `[tfdist-rank R] `
(`TAG`), which tfdist-run turns into its rank label: mpirun's own `--tag-output` tags
every write, not every line, and splits a traceback into fragments. SIGINT and SIGTERM
are passed to the child; the exit code is the child's, and a failing rank's last line says it
(`EXIT`), so that tfdist-run names the rank whose failure ended the job; the code is also
left in tfdist-run's `TFDIST_EXIT_REPORTS_DIR` (`report_exit`), read even while mpirun
does not end.
"""

import collections
import ctypes
import json
import os
import signal
import subprocess
import sys

from tfdist import env_vars
from tfdist.env_vars import Foreign

_PR_SET_PDEATHSIG = 1
TAG = "[tfdist-rank {rank}] "
EXIT = "[tfdist-rank {rank} exited {code}]"  # the last line of a rank that failed
REPORTED_LINES = 5  # a failed rank's last lines, kept in its exit report


def _end_with_this_process():
    """preexec_fn: SIGTERM to the command when this wrapper dies (SIGKILLed by mpirun or the
    launcher), so no rank outlives the job (Linux; elsewhere nothing)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m tfdist.launch.mpi_rank <command> [args...]", file=sys.stderr)
        return 2
    rank = Foreign.OMPI_COMM_WORLD_RANK.get()
    if rank is None:
        print("tfdist.launch.mpi_rank: not started by mpirun (no OMPI_COMM_WORLD_RANK)",
              file=sys.stderr)
        return 2
    names = [n for n in (env_vars.RANK_VARIABLES.get() or "").split(",") if n]
    env = dict(os.environ, **{name: rank for name in names})
    try:
        child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 preexec_fn=_end_with_this_process)
    except OSError as error:
        print(f"tfdist-run: cannot start {argv[0]!r}: {error}", file=sys.stderr, flush=True)
        return 127
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda received, _frame: child.send_signal(received))
    tag = TAG.format(rank=rank).encode()
    out = sys.stdout.buffer
    last = collections.deque(maxlen=REPORTED_LINES)
    for line in iter(child.stdout.readline, b""):
        out.write(tag + line if line.endswith(b"\n") else tag + line + b"\n")
        out.flush()
        last.append(line.decode(errors="replace").rstrip("\n"))
    code = child.wait()
    code = 128 - code if code < 0 else code
    if code != 0:
        report_exit(rank, code, list(last))
        out.write(EXIT.format(rank=rank, code=code).encode() + b"\n")
        out.flush()
    return code


def report_exit(rank, code, last_lines=()):
    """Leave the failed rank's exit code and its last lines of output where tfdist-run looks
    (`mpi_job.rank_failures`): mpirun, which relays the `EXIT` line and the output, may
    itself be held and not end."""
    directory = env_vars.EXIT_REPORTS_DIR.get()
    if not directory:
        return
    try:
        with open(os.path.join(directory, f".rank-{rank}"), "w", encoding="utf-8") as f:
            json.dump({"code": code, "last_lines": list(last_lines)}, f)
        os.replace(os.path.join(directory, f".rank-{rank}"), os.path.join(directory, rank))
    except OSError:  # the launcher's directory is gone: the job is ending anyway
        pass


if __name__ == "__main__":
    sys.exit(main())
