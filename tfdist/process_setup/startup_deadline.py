"""Start-up waits bounded by the job timeout: a wait that never returns ends the process, named.

Some start-up waits happen inside an engine that takes no timeout of its own and cannot be
interrupted: Open MPI's `MPI_Init` (through mpi4py's import), which connects to the
launcher's PMIx server - a server whose listener reads each new connection's handshake
with a blocking read, so one connection that sends a few bytes and stays open (a port
scanner, a stranger's client) stalls every rank's start-up for as long as it stays open -
and Horovod's `hvd.init()`, which waits in MPI or Gloo for every peer.

`bounded(...)` runs such a wait under a watchdog. The watchdog cannot be a thread of this
process: mpi4py calls `MPI_Init` holding Python's GIL, so no other Python thread runs until
it returns (measured: a thread printing every second stopped for the whole wait). It is a
small child process (`python -I -S -c ...`, about 20 ms to start) that waits on a pipe: when
the block finishes, the pipe is closed and the child exits; if the timeout passes first, the
child prints one line naming the rank, the wait and what can cause it, and kills this
process (SIGKILL: its signal handlers would need the GIL too). The launcher then stops the
other ranks and names this one, as for any failed rank. If this process dies first, the
pipe closes and the child exits. Cost: one short-lived child per bounded wait (two per
process at most).

    with startup_deadline.bounded("MPI_Init (Open MPI's start-up)", cluster.timeout,
                                  cluster.rank, "mpirun's PMIx server did not answer"):
        from mpi4py import MPI
"""

import contextlib
import os
import subprocess
import sys

# The watchdog child: argv = [timeout seconds, pid to kill, message]. It waits for its
# stdin to close (the block finished, or the parent died) for at most the timeout.
_WATCHDOG = r"""
import os, select, signal, sys
timeout, pid, message = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ready, _, _ = select.select([sys.stdin.buffer], [], [], timeout)
if not ready:
    try:
        os.write(2, (message + "\n").encode())
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
"""


def message(what, timeout, rank, cause=""):
    """The line printed when `what` outlasts `timeout` seconds on `rank`."""
    because = f": {cause}" if cause else ""
    return (f"tfdist rank {rank}: {what} did not finish within the {timeout:g} s timeout"
            f"{because}; this process is ended (SIGKILL)")


@contextlib.contextmanager
def bounded(what, timeout, rank, cause=""):
    """Run the block; if it lasts more than `timeout` seconds, say so and end the process.

    Args:
        what: the wait, in words ("MPI_Init (Open MPI's start-up)").
        timeout: seconds the block may take (the job timeout).
        rank: this process's rank, for the message.
        cause: what can make this wait last for ever, said after the timeout.
    """
    try:
        watchdog = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-I", "-S", "-c", _WATCHDOG, f"{timeout:g}", str(os.getpid()),
             message(what, timeout, rank, cause)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, close_fds=True)
    except OSError:  # no process to spare: the wait runs unbounded rather than not at all
        watchdog = None
    try:
        yield
    finally:
        if watchdog is not None:
            watchdog.stdin.close()
            watchdog.wait()
