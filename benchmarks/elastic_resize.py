"""`tfdist-bench --only elastic`: how long an elastic tfdist-run job takes to resize.

One job per round, `tfdist-run -np 2 --min-np 1 --max-np 3
--host-discovery-script "cat SLOTS"`, a fit of an MLP under
`BackupAndRestore(save_freq=10)` (each step also sleeps 20 ms so the driver
can act between steps). The driver, reading rank 0's step lines:

1. **cold start**: the launcher starts -> the first training step (the baseline);
2. **grow 2 -> 3**: SLOTS changes to 3 after 40 steps -> the first step at 3
   processes (the request, the backup at the agreed step, the new start,
   the restore and the replay of the input);
3. **shrink 3 -> 2**: SLOTS changes back to 2 -> the first step at 2;
4. **kill**: rank 1 is SIGKILLed -> the first step at 1 process (the
   launcher sees the loss, stops the others, restarts from the last backup).

Per resize: seconds from the event to the first step at the new size (and
its two parts: until the old size's last step, then the restart), that time
over the round's cold start, and the steps trained twice (0 for a planned
resize; up to save_freq after a kill). Rounds are independent jobs;
medians over rounds. Result: benchmarks/results/elastic_resize.json.

    python -m benchmarks.elastic_resize [--rounds 3]
    python benchmarks/elastic_resize.py --worker BACKUP_DIR STEPS
"""

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 400  # the job's steps: one epoch
SAVE_FREQ = 10
STEP_PAUSE = 0.02
ACT_AFTER = 40  # steps of a run before the driver acts
ROUNDS = 3
STEP_LINE = re.compile(r"^\[0\] step (\d+) world (\d+) at ([\d.]+)")
PID_LINE = re.compile(r"^\[(\d+)\] pid (\d+) world (\d+)")


def worker(backup_dir, steps):
    """One rank: a fit backed up every SAVE_FREQ steps; rank 0 prints each step's time."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel

    import tfdist  # pylint: disable=import-outside-toplevel

    strategy = tfdist.strategies.RingAllReduceStrategy()
    print(f"pid {os.getpid()} world {strategy.world_size}", flush=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * 32, 64)).astype("float32")
    y = rng.integers(0, 10, size=steps * 32)
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(keras.optimizers.Adam(1e-3),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class Steps(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if strategy.is_chief:
                step = int(self.model.optimizer.iterations.numpy())
                print(f"step {step} world {strategy.world_size} at {time.time():.3f}",
                      flush=True)
            time.sleep(STEP_PAUSE)

    model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False,
              callbacks=[keras.callbacks.BackupAndRestore(backup_dir, save_freq=SAVE_FREQ),
                         Steps()])


def _round(tmp, index):
    """One job: cold start, grow, shrink, kill; the seconds and steps of each."""
    slots = os.path.join(tmp, f"slots_{index}")
    with open(slots, "w") as f:
        f.write("localhost:2\n")
    command = [sys.executable, "-m", "tfdist.launch", "-np", "2", "--min-np", "1", "--max-np",
               "3", "--host-discovery-script", f"cat {slots}", sys.executable,
               os.path.abspath(__file__), "--worker", os.path.join(tmp, f"backup_{index}"),
               str(STEPS)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    started = time.time()
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=env)
    phases = [("grow", 3), ("shrink", 2), ("kill", 1)]
    events, pids, world, run_first, last_step, last_at = [], {}, 2, None, 0, 0.0
    first_step_at, pending = None, None  # pending: (name, event time, last step before)
    try:
        for line in job.stdout:
            pid = PID_LINE.match(line)
            if pid:
                pids[(int(pid.group(3)), int(pid.group(1)))] = int(pid.group(2))
                continue
            match = STEP_LINE.match(line)
            if not match:
                continue
            step, size, at = int(match.group(1)), int(match.group(2)), float(match.group(3))
            if first_step_at is None:
                first_step_at = at
            if pending is not None and size != world:
                name, event_at, _ = pending
                events.append({"resize": name, "from": world, "to": size,
                               "seconds": round(at - event_at, 2),
                               "steps_after_the_event": last_step - pending[2],
                               "old_size_stopped_after_seconds": round(last_at - event_at, 2),
                               "restart_seconds": round(at - last_at, 2),
                               "steps_redone": last_step - (step - 1)})
                pending, world, run_first = None, size, step
            if run_first is None:
                run_first = step
            last_step, last_at = step, at
            if pending is None and phases and step - run_first >= ACT_AFTER:
                name, target = phases.pop(0)
                if name == "kill":
                    os.kill(pids[(world, 1)], signal.SIGKILL)
                else:
                    with open(slots, "w") as f:
                        f.write(f"localhost:{target}\n")
                pending = (name, time.time(), step)
        job.wait(timeout=600)
    finally:
        job.kill()
    if job.returncode != 0 or len(events) != 3:
        raise RuntimeError(f"round {index}: exit {job.returncode}, events {events}")
    cold = first_step_at - started
    for event in events:
        event["over_cold_start"] = round(event["seconds"] / cold, 2)
    return {"cold_start_seconds": round(cold, 2), "events": events, "last_step": last_step}


def run(tmp, rounds=ROUNDS):
    """Independent rounds; writes elastic_resize.json."""
    from benchmarks.harness import write_result  # pylint: disable=import-outside-toplevel

    start = time.perf_counter()
    results = [_round(tmp, index) for index in range(rounds)]
    summary = {"cold_start_seconds": statistics.median(r["cold_start_seconds"]
                                                       for r in results)}
    for position, name in enumerate(("grow", "shrink", "kill")):
        seconds = [r["events"][position]["seconds"] for r in results]
        ratios = [r["events"][position]["over_cold_start"] for r in results]
        redone = [r["events"][position]["steps_redone"] for r in results]
        summary[f"{name}_seconds"] = statistics.median(seconds)
        summary[f"{name}_over_cold_start"] = statistics.median(ratios)
        summary[f"{name}_steps_redone_max"] = max(redone)
        summary[f"{name}_restart_seconds"] = statistics.median(
            r["events"][position]["restart_seconds"] for r in results)
    result = {
        "summary": summary, "rounds": results,
        "minutes": round((time.perf_counter() - start) / 60, 1),
        "description": (
            "Elastic tfdist-run (--min-np 1 --max-np 3, a discovery script reading a file): an "
            f"MLP 64-256-256-10 with Adam, global batch 32, {STEPS} steps, BackupAndRestore("
            f"save_freq={SAVE_FREQ}), {STEP_PAUSE * 1000:g} ms pause per step. cold start: "
            "launch -> first step at 2 processes. grow / shrink: the discovery file changed "
            "(2 -> 3, 3 -> 2) -> the first step at the new size. kill: SIGKILL to rank 1 at 2 "
            "processes -> the first step at 1. over_cold_start: that time / the round's cold "
            "start, split into old_size_stopped_after_seconds (the event -> the last step at the "
            "old size: the discovery's 1 s poll, the ranks' 0.5 s poll, the steps until the "
            "agreed one) and restart_seconds (that step -> the first at the new size: backup, "
            "exit, start, restore, replay). steps_redone: steps trained again after the resize "
            "(planned: 0; kill: up to save_freq). Medians over independent rounds."),
    }
    write_result("elastic_resize.json", result)
    print(f"elastic_resize: {summary}", flush=True)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=2, metavar=("BACKUP_DIR", "STEPS"))
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker[0], int(args.worker[1]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        run(tmp, args.rounds)


if __name__ == "__main__":
    main()
