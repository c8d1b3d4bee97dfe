"""Errors tfdist raises when the job, not the user's model, is at fault."""


class ClusterError(RuntimeError):
    """The processes of the job cannot form or keep a working group.

    The message names this process's rank and the peer (rank and address)
    at fault, and the cause: unreachable, timed out, or port in use.
    """
