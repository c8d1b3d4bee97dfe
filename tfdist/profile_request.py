"""What `tfdist-run --profile DIR --profile-steps A:B` asks every rank to profile (no TensorFlow here).

The launcher validates the request and passes it in the environment
(`PROFILE_DIR_ENV`, `PROFILE_STEPS_ENV`); each rank's strategy reads it back
(`tfdist.strategies.profiling.profiler_from_environment`).
"""

PROFILE_DIR_ENV = "TFDIST_PROFILE_DIR"
PROFILE_STEPS_ENV = "TFDIST_PROFILE_STEPS"
DEFAULT_PROFILE_STEPS = "10:12"


def parse_profile_steps(text):
    """(first, last) training batches from "A:B" (1-based, inclusive) or "A" (one batch)."""
    parts = str(text).split(":")
    try:
        first, last = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (None, None)
    except ValueError:
        first, last = None, None
    if first is None or not 1 <= first <= last:
        raise ValueError(f"profile steps must be 'A:B' with 1 <= A <= B (training batches, "
                         f"counted from 1 in each fit), or one batch 'A'. Got: {text!r}")
    return first, last
