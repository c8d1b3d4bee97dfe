"""Profiling: tfdist/ scalars in an unchanged Keras TensorBoard run, every rank's profile, the
merged timeline, and the scalars seen in a real browser.

The worker script (tests/scripts/profiled_training.py) is a keras.io-style
text classifier whose only profiling code is `keras.callbacks.TensorBoard(
log_dir, update_freq=4, profile_batch=(3, 5))` and `CommunicationMonitor()`.
Set TFDIST_SCREENSHOT_TO=path to keep the browser test's screenshot (docs/images/, shown on the Profiling page).
(Counting on the hard path - empty slices, a custom step, clipping - runs as simulated
ranks: test_profiling_in_process.py.)
"""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from helpers import failure_report, headless_browser, horovodrun, script, tfdist_run
from tfdist.comm.ports import pick_ports
from tfdist.profiling import names, timeline

TOLERANCE = 1e-4
UPDATE_FREQ = 4
BATCHES = 18  # 2 epochs of 288 training rows in global batches of 32
COMMON_TAGS = {"comm_ms", "step_ms", "comm_share", "sent_mb", "algbw_gbps", "busbw_gbps",
               "wait_ms", "slowest_rank"}


def run_job(directory, strategy, np_=2, launcher=None, profile_batch="3:5", launch=tfdist_run,
            extra_env=None, options=()):
    out, log_dir = str(directory / "out"), str(directory / "logs")
    args = [script("profiled_training.py"), out, log_dir, "--strategy", strategy,
            "--update-freq", str(UPDATE_FREQ), "--profile-batch", profile_batch, *options]
    if launch is tfdist_run:
        done = tfdist_run(np_, args, timeout=600, run_timeout=120, launcher=launcher,
                          extra_env=extra_env)
    else:
        done = launch(np_, args + ["--backend", "horovod"], timeout=600, run_timeout=120,
                      extra_env=extra_env)
    assert done.returncode == 0, failure_report(done)
    ranks = []
    for rank in range(np_):
        with open(f"{out}.rank{rank}.json") as f:
            ranks.append(json.load(f))
    return ranks, log_dir, done


def scalars(run_dir):
    """{tag: [(step, value)]} of the tfdist/ scalars in one TensorBoard run directory."""
    accumulator = EventAccumulator(run_dir, size_guidance={"tensors": 0})
    accumulator.Reload()
    return {tag: [(e.step, float(np.asarray(_value(e)))) for e in accumulator.Tensors(tag)]
            for tag in accumulator.Tags()["tensors"] if tag.startswith("tfdist/")
            and tag != "tfdist/configuration"}


def _value(event):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf.make_ndarray(event.tensor_proto)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    return run_job(tmp_path_factory.mktemp("np1"), "ring", np_=1)[0][0]


@pytest.fixture(scope="module")
def ring_job(tmp_path_factory):
    return run_job(tmp_path_factory.mktemp("ring"), "ring")


def check_equivalent(ranks, one_process):
    for result in ranks:
        for key in ("loss", "val_loss"):
            assert np.allclose(result["history"][key], one_process["history"][key],
                               atol=TOLERANCE), (key, result["history"][key])
        for mine, single in zip(result["weights"], one_process["weights"]):
            assert np.max(np.abs(np.array(mine) - np.array(single))) <= TOLERANCE


def check_scalars(log_dir, expected_tags, ranks):
    written = scalars(os.path.join(log_dir, "train"))
    assert {f"tfdist/{t}" for t in expected_tags} <= set(written), sorted(written)
    for tag, points in written.items():
        steps = [step for step, _ in points]
        assert steps == list(range(UPDATE_FREQ, BATCHES + 1, UPDATE_FREQ)), tag
    assert all(value > 0 for _, value in written["tfdist/comm_ms"])
    sent = [value for _, value in written["tfdist/sent_mb"]]
    assert max(sent) == pytest.approx(min(sent), rel=1e-6), sent  # every step sends the same
    # Two processes: every algorithm sends at least each dense gradient byte once.
    assert min(sent) * 1e6 >= ranks[0]["gradient_bytes"] - 500 * 16 * 4  # minus the Embedding
    assert all(value in (0, 1) for _, value in written["tfdist/slowest_rank"])
    # Only the chief writes the run; every rank's History has the monitor's numbers.
    assert len(os.listdir(os.path.join(log_dir, "train"))) == 1
    for result in ranks:
        assert {t.replace("/", "_") for t in expected_tags} <= set(result["history"])


def check_profiles(log_dir, algorithm, np_=2):
    assert sorted(timeline.newest_profiles(log_dir)) == list(range(np_))
    overlap = timeline.write(log_dir)
    for rank, numbers in overlap["ranks"].items():
        phases = numbers["phases_ms"]
        assert any(p.startswith(f"tfdist/{algorithm}/gradients_") for p in phases), (rank, phases)
        assert [s["step"] for s in numbers["steps"]] == [3, 4, 5]
        assert numbers["total"]["comm_ms"] > 0
    with open(os.path.join(log_dir, timeline.TIMELINE_FILE)) as f:
        events = json.load(f)["traceEvents"]
    assert {e["pid"] for e in events} == set(range(np_))


def test_ring_writes_tfdist_scalars_into_the_tensorboard_run_and_profiles_every_rank(
        ring_job, one_process):
    ranks, log_dir, _ = ring_job
    check_equivalent(ranks, one_process)
    check_scalars(log_dir, COMMON_TAGS, ranks)
    check_profiles(log_dir, "ring")


@pytest.mark.slow  # make test-all (make test stays within 20 min: tests/tiers.py)
def test_parameter_server_reports_its_load_per_server(tmp_path, one_process):
    ranks, log_dir, _ = run_job(tmp_path, "ps", launcher=["--num-servers", "2"])
    check_equivalent(ranks, one_process)
    check_scalars(log_dir, COMMON_TAGS | {"ps/server_0_mb", "ps/server_1_mb"}, ranks)
    check_profiles(log_dir, "ps")


@pytest.mark.slow  # make test-all (make test stays within 20 min: tests/tiers.py)
def test_tree_profiled_by_tfdist_run_gets_a_merged_timeline(tmp_path, one_process):
    profile_dir = str(tmp_path / "profile")
    ranks, log_dir, done = run_job(
        tmp_path, "tree", profile_batch="0",
        launcher=["--profile", profile_dir, "--profile-steps", "3:5"])
    check_equivalent(ranks, one_process)
    check_scalars(log_dir, COMMON_TAGS, ranks)
    assert not os.path.exists(os.path.join(log_dir, "rank_0"))  # profile_batch=0: none there
    for name in (timeline.TIMELINE_FILE, timeline.OVERLAP_FILE, timeline.FIGURE_FILE):
        assert os.path.exists(os.path.join(profile_dir, name)), done.stdout[-2000:]
    assert "% hidden" in done.stdout
    check_profiles(profile_dir, "tree")


@pytest.mark.slow  # make test-all (make test stays within 20 min: tests/tiers.py)
def test_asynchronous_parameter_server_reports_staleness(tmp_path):
    ranks, log_dir, _ = run_job(tmp_path, "async", launcher=["--num-servers", "1"],
                                profile_batch="0")
    written = scalars(os.path.join(log_dir, "train"))
    for tag in ("comm_ms", "sent_mb", "ps/server_0_mb", "ps/staleness_mean",
                "ps/staleness_max", "ps/wait_ms"):
        assert f"tfdist/{tag}" in written, sorted(written)
    assert max(v for _, v in written["tfdist/ps/staleness_max"]) <= 2  # staleness=2 (SSP)


@pytest.mark.horovod
@pytest.mark.slow  # make test-all (make test stays within 20 min: tests/tiers.py)
def test_horovod_ring_writes_tfdist_scalars_and_horovods_timeline(tmp_path, one_process):
    ranks, log_dir, _ = run_job(tmp_path, "ring", launch=horovodrun,
                                extra_env={"HOROVOD_TIMELINE": "DYNAMIC"})
    check_equivalent(ranks, one_process)
    check_scalars(log_dir, COMMON_TAGS, ranks)
    # TensorFlow's profiler does not see Horovod's ops: rank 0's communication comes from
    # Horovod's own timeline, recorded over the same batches and merged.
    assert os.path.exists(os.path.join(log_dir, "rank_0", timeline.HOROVOD_TIMELINE_FILE))
    overlap = timeline.write(log_dir)
    phases = overlap["ranks"]["0"]["phases_ms"]
    assert any(p.startswith("tfdist/ring/gradients_") for p in phases), phases
    assert overlap["ranks"]["0"]["total"]["comm_ms"] > 0
    with open(os.path.join(log_dir, timeline.TIMELINE_FILE)) as f:
        rows = {e["args"]["name"] for e in json.load(f)["traceEvents"]
                if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 0}
    assert "Horovod timeline" in rows


def test_bad_profile_steps_are_refused_by_the_launcher():
    done = subprocess.run([sys.executable, "-m", "tfdist.launch", "-np", "2", "--profile", "x",
                           "--profile-steps", "5:2", sys.executable, "-c", "pass"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--profile-steps" in done.stderr and "'5:2'" in done.stderr


# ------------------------------------------------------------- browser
def _start_tensorboard(log_dir):
    """A `tensorboard --logdir` process and its address, once it has loaded the tfdist scalars."""
    port = pick_ports(1)[0]
    board = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "tensorboard"), "--logdir", log_dir,
         "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:  # it serves before it has read the run directory: wait for the scalars
        try:
            with urllib.request.urlopen(f"{base}/data/plugin/scalars/tags", timeout=5) as reply:
                if "tfdist/comm_ms" in json.load(reply).get("train", {}):
                    return board, base
        except OSError:
            pass
        if time.monotonic() > deadline or board.poll() is not None:
            board.terminate()
            pytest.fail("tensorboard did not start or did not load the run")
        time.sleep(1)


def test_tfdist_scalars_show_in_tensorboard_in_a_real_browser(ring_job, tmp_path):
    from selenium.webdriver.common.by import By  # pylint: disable=import-outside-toplevel
    from selenium.webdriver.support.ui import WebDriverWait  # pylint: disable=C0415

    _, log_dir, _ = ring_job
    browser = headless_browser()
    board, base = _start_tensorboard(log_dir)
    try:
        with urllib.request.urlopen(f"{base}/data/plugins_listing", timeout=5) as reply:
            assert json.load(reply)["profile"]["enabled"], "no profile tab for the rank_<k> runs"
        # The Time Series dashboard (TensorBoard's default) filtered to tfdist's tags; SVG
        # charts, as headless Chromium has no WebGL.
        browser.get(f"{base}/?tagFilter=tfdist&forceSVG=true#timeseries")

        def card_titles(driver):  # the titles of the cards rendered now (None: none yet)
            return {e.get_attribute("title") for e in driver.find_elements(
                By.CSS_SELECTOR, "scalar-card-component tb-truncated-path.tag")} or None

        first_cards = {"tfdist/comm_ms", "tfdist/busbw_gbps"}
        WebDriverWait(browser, 60).until(
            lambda driver: first_cards <= (card_titles(driver) or set()))
        titles = card_titles(browser)
        shot = tmp_path / "tensorboard.png"
        browser.save_screenshot(str(shot))
        # Every card, scrolled into view one by one (the dashboard renders visible ones).
        seen = set(titles)
        for card in browser.find_elements(By.CSS_SELECTOR, "card-view"):
            browser.execute_script("arguments[0].scrollIntoView();", card)
            seen |= WebDriverWait(browser, 30).until(card_titles)
        assert {f"tfdist/{t}" for t in COMMON_TAGS} <= seen, sorted(seen)
        assert shot.stat().st_size > 10_000
        if os.environ.get("TFDIST_SCREENSHOT_TO"):
            shutil.copy(shot, os.environ["TFDIST_SCREENSHOT_TO"])
    finally:
        browser.quit()
        board.terminate()
        board.wait(timeout=30)
