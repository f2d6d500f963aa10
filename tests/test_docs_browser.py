"""The built docs site in a real browser: headless Chromium, driven over the DevTools Protocol.

Run by ``tox -e docs`` after ``mkdocs build`` (the site is ``$CVAE_DOCS_SITE``, default ``site/``).
The site is served from 127.0.0.1 by Python's ``http.server`` in a thread; Playwright drives the
system's Chromium (``$CVAE_CHROMIUM``, else ``chromium`` on the PATH: Debian's package), so nothing
downloads a browser. Without Chromium, Playwright or a built site, every test here is skipped and
the reason says which. Screenshots go to ``$CVAE_DOCS_SCREENSHOTS`` (default ``site-screenshots/``,
ignored by git): the first screenful of every page at 1400 px, and every side-by-side page whole
at 1400 and 800 px.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parent.parent
SITE = Path(os.environ.get("CVAE_DOCS_SITE") or ROOT / "site")
SHOTS = Path(os.environ.get("CVAE_DOCS_SCREENSHOTS") or ROOT / "site-screenshots")
LABELS = ["pure JAX", "Flax Linen", "Flax NNX", "Haiku", "Equinox"]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WIDE, NARROW = 1400, 800


def find_chromium() -> str | None:
    given = os.environ.get("CVAE_CHROMIUM")
    if given:
        return shutil.which(given) or (given if Path(given).is_file() else None)
    for name in BROWSERS:
        if path := shutil.which(name):
            return path
    return None


CHROMIUM = find_chromium()
if CHROMIUM is None:
    pytest.skip(
        f"no Chromium browser found (looked for $CVAE_CHROMIUM and {', '.join(BROWSERS)} on the "
        "PATH); install one, e.g. Debian's: apt-get install -y chromium",
        allow_module_level=True,
    )
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright is not installed here (pip install '.[docs]')"
)
if not (SITE / "index.html").is_file():
    pytest.skip(
        f"no built site at {SITE}: build it first (mkdocs build; tox -e docs does)",
        allow_module_level=True,
    )

PAGES = sorted(p.relative_to(SITE).as_posix() for p in SITE.rglob("*.html"))
SIDE_BY_SIDE = [
    p for p in PAGES if p.split("/")[0] in ("topics", "tour") and p.count("/") == 2
]  # topics/NAME/index.html and tour/NAME/index.html, not the sections' own index pages


def url_path(page: str) -> str:
    """``topics/jit/index.html`` -> ``topics/jit/``."""
    return page[: -len("index.html")] if page.endswith("index.html") else page


def slug(page: str) -> str:
    return url_path(page).strip("/").replace("/", "-") or "index"


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def base_url():
    handler = functools.partial(QuietHandler, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


def new_page(browser, base_url: str, width: int, problems: list[str]):
    """A tab of ``width`` x 900 px that records console errors, uncaught exceptions, failed and
    refused requests and HTTP errors into ``problems``; requests off the site are aborted."""
    page = browser.new_page(viewport={"width": width, "height": 900})

    def route(route):
        if route.request.url.startswith(base_url):
            route.continue_()
        else:
            problems.append(f"request to another host: {route.request.url}")
            route.abort()

    page.route("**/*", route)
    page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"exception: {e}"))
    # ERR_ABORTED is a request cut short by leaving the page (or refused by route above).
    page.on(
        "requestfailed",
        lambda r: (
            r.url.startswith(base_url)
            and "ERR_ABORTED" not in (r.failure or "")
            and problems.append(f"failed: {r.url} {r.failure}")
        ),
    )
    page.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"))
    return page


@pytest.fixture(scope="module")
def crawl(browser, base_url):
    """Every page loaded once at 1400 px: its problems, the links on it, the ids in it (waiting
    for the network to go quiet, so that late requests such as the search index count too)."""
    (SHOTS / str(WIDE)).mkdir(parents=True, exist_ok=True)
    seen = {}
    problems: list[str] = []
    page = new_page(browser, base_url, WIDE, problems)
    for name in PAGES:
        page.goto(base_url + url_path(name), wait_until="load")
        page.wait_for_load_state("networkidle", timeout=5000)  # the search index, fetched late
        links = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
        ids = page.evaluate(
            "() => [...document.querySelectorAll('[id], a[name]')].map(e => e.id || e.name)"
        )
        page.screenshot(path=SHOTS / str(WIDE) / f"{slug(name)}.png")  # the first screenful
        seen[name] = {"problems": problems[:], "links": links, "ids": set(ids)}
        problems.clear()
    page.close()
    return seen


def test_the_site_has_the_side_by_side_pages():
    assert len(SIDE_BY_SIDE) >= 17, SIDE_BY_SIDE  # 13 topics and 4 tour pages


def test_every_page_loads_without_errors(crawl):
    bad = {name: info["problems"] for name, info in crawl.items() if info["problems"]}
    assert not bad, bad


def test_every_internal_link_and_anchor_resolves(crawl, base_url):
    broken = []
    for name, info in crawl.items():
        for link in info["links"]:
            if not link.startswith(base_url):
                continue  # another site, or mailto: (nothing is fetched from outside)
            parts = urlsplit(link)
            path = unquote(parts.path).lstrip("/")
            target = path + "index.html" if path == "" or path.endswith("/") else path
            if not (SITE / target).is_file():
                broken.append(f"{name}: {link} (no {target})")
            elif (
                parts.fragment
                and target in crawl
                and unquote(parts.fragment) not in crawl[target]["ids"]
            ):
                broken.append(f"{name}: {link} (no #{parts.fragment} in {target})")
    assert not broken, "\n".join(broken)


SETS = """() => [...document.querySelectorAll('.rosetta .tabbed-set')].map(set => ({
    labels: [...set.querySelectorAll(':scope > .tabbed-labels > label')]
        .map(l => l.textContent.trim()),
    code: [...set.querySelectorAll(':scope > .tabbed-content > .tabbed-block')].map(
        b => (b.querySelector('code') || {textContent: ''}).textContent.trim().length),
}))"""


@pytest.mark.parametrize("name", SIDE_BY_SIDE, ids=slug)
def test_every_side_by_side_page_shows_every_implementation(browser, base_url, name):
    problems: list[str] = []
    page = new_page(browser, base_url, WIDE, problems)
    page.goto(base_url + url_path(name))
    sets = page.evaluate(SETS)
    page.close()
    assert sets, f"{name} has no side-by-side tab set"
    for i, found in enumerate(sets):
        assert found["labels"] == LABELS, (name, i, found["labels"])
        assert all(length > 20 for length in found["code"]), (name, i, found["code"])


LAYOUT = """() => {
  const vw = document.documentElement.clientWidth;
  const box = e => { const r = e.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, width: r.width, height: r.height}; };
  return {
    vw, pageOverflow: document.documentElement.scrollWidth - vw,
    sets: [...document.querySelectorAll('.rosetta .tabbed-set')].map(set => ({
      box: box(set), overflow: set.scrollWidth - set.clientWidth,
      labels: [...set.querySelectorAll(':scope > .tabbed-labels > label')].map(box),
      blocks: [...set.querySelectorAll(':scope > .tabbed-content > .tabbed-block')].map(b => ({
        ...box(b), shown: getComputedStyle(b).display !== 'none' && b.offsetHeight > 0,
        codeOverflow: Math.max(0, ...[...b.querySelectorAll('pre > code')].map(
          c => c.scrollWidth - c.clientWidth)),
      })),
    })),
  };
}"""


def check_columns(layout, name: str) -> None:
    for i, s in enumerate(layout["sets"]):
        where = f"{name} tab set {i}"
        blocks, labels = s["blocks"], s["labels"]
        assert [b["shown"] for b in blocks] == [True] * 5, where
        assert max(b["top"] for b in blocks) - min(b["top"] for b in blocks) < 1, where
        lefts = [b["left"] for b in blocks]
        assert lefts == sorted(lefts) and len(set(lefts)) == 5, (where, lefts)
        for b, label in zip(blocks, labels, strict=True):
            assert b["width"] > 150, (where, b)
            assert s["box"]["left"] - 1 <= b["left"] and b["right"] <= s["box"]["right"] + 1, where
            assert abs(label["left"] - b["left"]) < 2, (where, "label not above its column")
            assert b["codeOverflow"] <= 1, (where, "code wider than its column", b)
        assert s["box"]["right"] <= layout["vw"] + 1, where


def check_tabs(layout, name: str) -> None:
    for i, s in enumerate(layout["sets"]):
        where = f"{name} tab set {i}"
        assert sum(b["shown"] for b in s["blocks"]) == 1, where
        assert all(label["width"] > 0 for label in s["labels"]), where
        shown = next(b for b in s["blocks"] if b["shown"])
        assert shown["right"] <= s["box"]["right"] + 1, where
        assert s["box"]["right"] <= layout["vw"] + 1, where


@pytest.mark.parametrize("width", [WIDE, NARROW])
def test_side_by_side_pages_fit_the_screen(browser, base_url, width):
    """Columns at 1400 px, tabs at 800 px, and nothing wider than the window at either."""
    (SHOTS / str(width)).mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    page = new_page(browser, base_url, width, problems)
    failures = []
    for name in SIDE_BY_SIDE:
        page.goto(base_url + url_path(name))
        layout = page.evaluate(LAYOUT)
        page.screenshot(path=SHOTS / str(width) / f"{slug(name)}.png", full_page=True)
        try:
            assert layout["pageOverflow"] <= 0, f"{name}: page {layout['pageOverflow']} px too wide"
            (check_columns if width == WIDE else check_tabs)(layout, name)
        except AssertionError as error:
            failures.append(str(error))
    page.close()
    assert not failures, "\n".join(failures)
    assert not problems, problems


def test_choosing_a_tab_switches_every_tab_set_and_is_remembered(browser, base_url):
    problems: list[str] = []
    page = new_page(browser, base_url, NARROW, problems)
    first, second = SIDE_BY_SIDE[0], SIDE_BY_SIDE[1]
    page.goto(base_url + url_path(first))
    page.locator(".rosetta .tabbed-labels > label", has_text="Equinox").first.click()
    shown = """() => [...document.querySelectorAll('.rosetta .tabbed-set')].map(set =>
        [...set.querySelectorAll(':scope > .tabbed-content > .tabbed-block')]
            .findIndex(b => getComputedStyle(b).display !== 'none'))"""
    assert set(page.evaluate(shown)) == {4}, first
    page.goto(base_url + url_path(second))  # content.tabs.link keeps the choice across pages
    assert set(page.evaluate(shown)) == {4}, second
    page.close()
    assert not problems, problems
