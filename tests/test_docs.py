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
