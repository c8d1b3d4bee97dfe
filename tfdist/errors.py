"""Errors tfdist raises when the job, not the user's model, is at fault."""

import re


class ClusterError(RuntimeError):
    """The processes of the job cannot form or keep a working group.

    The message names this process's rank and the peer (rank and address)
    at fault, and the cause: unreachable, timed out, or port in use.
    """


_ASSERTION = re.compile(r"assertion failed: ((?:\[[^\]]*\] ?)+)")


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
