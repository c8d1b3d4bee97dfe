"""Errors tfdist raises when the job, not the user's model, is at fault, and how they are told.

A failure in a multi-process job surfaces deep in a TensorFlow traceback (a
gRPC status, an assertion inside a compiled step). Each part of tfdist that
can explain such a failure registers an explainer (`explain_uncaught`); one
`sys.excepthook`, installed once, prints their one-line explanations after
the traceback, so the last lines a user reads name the cause and the rank.
"""

import re
import sys
import threading


class ClusterError(RuntimeError):
    """The processes of the job cannot form or keep a working group.

    The message names this process's rank and the peer (rank and address)
    at fault, and the cause: unreachable, timed out, or port in use.
    """


class NotDistributedError(ValueError):
    """A model about to train on this process alone in a multi-process job.

    Raised by `fit` (and `train_on_batch`) for a model created outside the
    scope of the tfdist strategy the process created: Keras would train it
    locally, and the job's processes would train independent copies. The
    message says to create the model under `strategy.scope()`.
    """


class Preempted(Exception):
    """Every rank backed up at the step they agreed on after a preemption notice.

    Raised from the fit loop's callback list right after that backup
    (`tfdist.fault_tolerance.preemption`); `fit` turns it into
    `SystemExit(PREEMPTED_EXIT_CODE)` (42, `tfdist.fault_tolerance.restarts`),
    which launchers tell from a crash. `epoch` and `steps_done` are the
    backup's position.
    """

    def __init__(self, epoch, steps_done):
        super().__init__(f"preempted: backed up at epoch {epoch + 1} after {steps_done} of "
                         "its steps")
        self.epoch = epoch
        self.steps_done = steps_done


_ASSERTION = re.compile(r"assertion failed: ((?:\[[^\]]*\] ?)+)")


class ServerRoleFinished(SystemExit):
    """A script started as a parameter server served its shard; the script ends here.

    Raised by `ParameterServerStrategy()` in a process of the server role
    (`tfdist-run --num-servers K`, a TF_CONFIG `ps` task) once every worker
    is done: the rest of the script is the workers'. A `SystemExit`, so the
    interpreter exits with `code` (the server's: 0, or 1 after a failure it
    reported) without a traceback, and `except Exception` does not catch it.
    """


def tfdist_assertion(error):
    """The one-line message of a tfdist check inside a compiled step, or None.

    tfdist reports failures found inside a step (a server stopped, a piece
    out of order) with `tf.debugging.Assert`, which prints its parts as
    "assertion failed: [text] [value] [text]" deep in a traceback; this joins
    them into the sentence they form.
    """
    match = _ASSERTION.search(str(error))
    if not match:
        return None
    parts = re.findall(r"\[([^\]]*)\]", match.group(1))
    if not parts or not parts[0].startswith("tfdist"):
        return None
    return " ".join(part.strip() for part in parts)


_explainers = []
_explainers_lock = threading.Lock()


def explain_uncaught(explainer):
    """Print `explainer(exception)` (a line, or None) after the traceback of an uncaught error.

    Explainers run in registration order; each may print its own lines
    instead of returning one. The hook chains to the `sys.excepthook` that
    was in place when the first explainer was registered.
    """
    with _explainers_lock:
        if not _explainers:
            previous = sys.excepthook

            def hook(kind, value, traceback):
                previous(kind, value, traceback)
                for explain in list(_explainers):
                    line = explain(value)
                    if line:
                        print(line, file=sys.stderr, flush=True)

            sys.excepthook = hook
        _explainers.append(explainer)
