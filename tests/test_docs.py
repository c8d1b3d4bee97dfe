"""The documentation site (mkdocs.yml, docs/): it builds strictly, documents every public name
and every environment variable, and its pages render in a browser without a broken link."""

import functools
import html.parser
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
    "tfdist.horovod.gradient_tape.DistributedGradientTape",
    "tfdist.horovod.collectives.broadcast_variables",
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
        for path, heading in (("", "tfdist"), ("getting-started/", "Getting started"),
                              ("strategies/", "Strategies"), ("profiling/", "Profiling"),
                              ("api/", "API reference")):
            browser.get(base + path)
            assert browser.find_element(By.CSS_SELECTOR, "article h1").text.startswith(heading)
            assert "404" not in browser.title
            images = browser.find_elements(By.CSS_SELECTOR, "article img")
            if path == "strategies/":  # the ring, tree, PS and async diagrams
                assert len(images) >= 4, path
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


class _RenderedText(html.parser.HTMLParser):
    """The text of each paragraph, list item, heading and table cell of a built page's
    article, outside code: where Markdown left unrendered would show."""

    BLOCKS = {"p", "li", "td", "th", "h1", "h2", "h3", "h4", "dd", "dt"}

    def __init__(self):
        super().__init__()
        self.blocks = []  # (tag, text)
        self._open = []  # [tag, [text parts]] of the enclosing blocks
        self._in_article = self._in_code = 0

    def handle_starttag(self, tag, attrs):
        if tag == "article":
            self._in_article += 1
        elif tag in ("code", "pre"):
            self._in_code += 1
        elif tag in self.BLOCKS and self._in_article:
            self._open.append([tag, []])

    def handle_endtag(self, tag):
        if tag == "article":
            self._in_article -= 1
        elif tag in ("code", "pre"):
            self._in_code -= 1
        elif tag in self.BLOCKS and self._open and self._open[-1][0] == tag:
            opened, parts = self._open.pop()
            self.blocks.append((opened, "".join(parts)))

    def handle_data(self, data):
        if self._open and not self._in_code:
            self._open[-1][1].append(data)


_RAW_MARKDOWN = (
    (re.compile(r"(^|\n)\s*([-*+]|\d+\.) \S"), "a list item inside a paragraph (the list "
                                                "collapsed: a blank line missing before it?)"),
    (re.compile(r"\*\*\S|\S\*\*"), "literal ** (bold not rendered)"),
    (re.compile(r"\|\s*:?-{3,}"), "a table's |---| row (the table not rendered)"),
    (re.compile(r"```"), "a code fence not rendered"),
    (re.compile(r"\]\((?:[^)\s]+)\)"), "a [link](target) not rendered"),
    (re.compile(r"(^|\n)#{1,6} \S"), "a # heading not rendered"),
)


def raw_markdown(page_html):
    """[(what, tag, excerpt)] for each place a built page shows Markdown as text."""
    parser = _RenderedText()
    parser.feed(page_html)
    found = []
    for tag, text in parser.blocks:
        for pattern, what in _RAW_MARKDOWN:
            if tag.startswith("h") and what.startswith("a list item"):
                continue  # "1. Install" is a numbered heading's text
            match = pattern.search(text)
            if match:
                start = max(0, match.start() - 60)
                found.append((what, tag, text[start:match.end() + 60]))
    return found


def test_the_raw_markdown_check_finds_a_collapsed_list():
    """The check below fails on what it is for: a list written right after a paragraph line."""
    collapsed = "<article><p>Guarantees:\n- <strong>Exact.</strong> one\n- two</p></article>"
    assert [what for what, _, _ in raw_markdown(collapsed)][0].startswith("a list item")
    assert raw_markdown("<article><p>plain</p><ul><li>a</li></ul>"
                        "<pre><code>- in code\n**x**</code></pre></article>") == []


def test_no_page_shows_raw_markdown(site):
    """Every built page, as a reader sees it: no list collapsed into a paragraph, no literal
    **, table rows, fences, links or headings (mkdocs build --strict passes regardless)."""
    problems = []
    for directory, _, files in os.walk(site):
        if "index.html" not in files or os.path.relpath(directory, site).startswith(
                ("assets", "search", "results")):
            continue
        with open(os.path.join(directory, "index.html"), encoding="utf-8") as f:
            for what, tag, excerpt in raw_markdown(f.read()):
                problems.append(f"{os.path.relpath(directory, site)}: {what} in <{tag}>: "
                                f"{excerpt!r}")
    assert not problems, "\n".join(problems)


QUICKSTART = os.path.join(ROOT, "examples", "quickstart.py")


def test_the_readme_example_is_the_quickstart_script():
    """The README's example is complete and runnable: it is examples/quickstart.py, verbatim
    (Getting started includes the file itself)."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    with open(QUICKSTART, encoding="utf-8") as f:
        assert f.read() in blocks


def test_the_quickstart_prints_what_getting_started_shows(tmp_path):
    """The newcomer's path: the quickstart on one process and under tfdist-run -np 2 prints
    the same epoch lines (the metrics, not the timings), the job's start-up line and the
    batch split, writes its model, and says nothing of independent processes."""
    def epochs(output):
        return [re.sub(r" - \d+m?s - \d+m?s/step", "", line.removeprefix("[0] "))
                for line in output.splitlines() if "accuracy:" in line]

    alone = subprocess.run([sys.executable, QUICKSTART], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "tfdist: RingAllReduceStrategy on 1 process: Keras trains as it does without " \
           "tfdist" in alone.stderr
    assert "oneDNN" not in alone.stderr and "absl::InitializeLog" not in alone.stderr
    job = subprocess.run([sys.executable, "-m", "tfdist.launch", "-np", "2", sys.executable,
                          QUICKSTART], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    output = job.stdout + job.stderr
    assert job.returncode == 0, output[-3000:]
    assert len(epochs(alone.stdout)) == 3 and epochs(output) == epochs(alone.stdout), output
    assert "[0] tfdist: RingAllReduceStrategy on 2 processes launched by tfdist-run: " \
           "aggregator ring on" in output
    assert "[0] tfdist: global batch 64 = 32 per process x 2" in output
    assert "ran independently" not in output and "Started server" not in output
    assert (tmp_path / "quickstart.keras").exists()
