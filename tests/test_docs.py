"""The documentation site (mkdocs.yml, docs/): it builds strictly, documents every public name
and every environment variable, and its pages render in a browser without a broken link."""

import functools
import http.server
import os
import re
import subprocess
import sys
import threading
import urllib.parse

import pytest

from helpers import headless_browser
from tfdist import env_vars

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The public API contract (the design's list): each needs an entry on the API page.
CONTRACT = (
    "tfdist.strategies.RingAllReduceStrategy", "tfdist.strategies.ReductionTreeStrategy",
    "tfdist.strategies.ParameterServerStrategy",
    "tfdist.callbacks.LearningRateScaling", "tfdist.callbacks.LearningRateWarmup",
    "tfdist.callbacks.LearningRateSchedule", "tfdist.callbacks.StalenessMonitor",
    "tfdist.callbacks.StalenessAwareLearningRate", "tfdist.callbacks.CommunicationMonitor",
    "tfdist.compression.FP16", "tfdist.compression.PowerSGD", "tfdist.compression.TopK",
    "tfdist.compression.SignSGD", "tfdist.aggregation.recommend.recommend",
    "tfdist.horovod.process.init", "tfdist.horovod.optimizer.DistributedOptimizer",
    "tfdist.horovod.keras.callbacks.BroadcastGlobalVariablesCallback",
    "tfdist.horovod.keras.callbacks.MetricAverageCallback",
    "tfdist.horovod.keras.callbacks.LearningRateWarmupCallback",
    "tfdist.horovod.elastic_state.run", "tfdist.horovod.elastic_state.KerasState",
    "tfdist.horovod.keras.elastic.CommitStateCallback",
)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once with --strict (a broken link or reference fails the build)."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "-d", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _page(site, name):
    with open(os.path.join(site, name, "index.html") if name else
              os.path.join(site, "index.html")) as f:
        return f.read()


def test_every_public_name_has_a_reference_entry(site):
    api = _page(site, "api")
    missing = [name for name in CONTRACT if f'id="{name}"' not in api]
    assert not missing, missing


def test_every_environment_variable_is_in_the_generated_table(site):
    page = _page(site, "environment")
    missing = [v.name for v in env_vars.VARIABLES if f"<code>{v.name}</code>" not in page]
    assert not missing, missing


def test_troubleshooting_lists_the_messages_tfdist_raises(site):
    page = _page(site, "troubleshooting")
    # One message of each kind: a launcher's, a cluster's, a strategy's.
    for words in ("must be one of", "is out of range for", "training processes on this host"):
        assert words in page, words
    assert page.count("<li><strong>") >= 100


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        del format, args


def _serve(directory):
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_pages_render_in_a_browser_and_link_only_to_pages_that_exist(site):
    """Home, a guide and the API page in headless Chromium: each renders its content and
    images, and every link on it to the site resolves to a page that is there."""
    from selenium.webdriver.common.by import By  # pylint: disable=import-outside-toplevel

    browser = headless_browser()
    server = _serve(site)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        for path, heading in (("", "tfdist"), ("profiling/", "Profiling"),
                              ("api/", "API reference")):
            browser.get(base + path)
            assert browser.find_element(By.CSS_SELECTOR, "article h1").text.startswith(heading)
            assert "404" not in browser.title
            images = browser.find_elements(By.CSS_SELECTOR, "article img")
            assert all(browser.execute_script("return arguments[0].naturalWidth", image) > 0
                       for image in images), path
            for link in browser.find_elements(By.CSS_SELECTOR, "a[href]"):
                href = urllib.parse.urldefrag(link.get_attribute("href"))[0]
                if not href.startswith(base):
                    continue
                target = os.path.join(site, urllib.parse.unquote(href[len(base):]))
                if os.path.isdir(target):
                    target = os.path.join(target, "index.html")
                assert os.path.exists(target), (path, href)
        assert len(re.findall("<article", _page(site, "api"))) == 1
    finally:
        browser.quit()
        server.shutdown()
