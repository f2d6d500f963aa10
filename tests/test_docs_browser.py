"""The built docs site in a real browser: headless Chromium, driven over the DevTools Protocol.

Run by ``tox -e docs`` after ``mkdocs build`` (the site is ``$CVAE_DOCS_SITE``, default ``site/``).
The site is served from 127.0.0.1 by Python's ``http.server`` in a thread; Playwright drives the
system's Chromium (``$CVAE_CHROMIUM``, else ``chromium`` on the PATH: Debian's package), so nothing
downloads a browser. Without Chromium, Playwright or a built site, every test here is skipped and
the reason says which. Screenshots go to ``$CVAE_DOCS_SCREENSHOTS`` (default ``site-screenshots/``,
ignored by git): the first screenful of every page at 1440 px, every side-by-side page whole at
1440, 800 and 390 px, and the views of two implementations (``pair/``) with their measurements
(``pair/measurements.json``: the widest code line against its column, for every pair), the
choosing and performance pages whole at 1440 x 900 px with their tables' measurements
(``layout/``: the page's height, the text column's width, every table's top, width and sideways
scroll), and the screens the reading checks look at (``reading/``: the compare page and a topic
page at mid-block, at 1440 x 900 and 390 x 844 px).
"""

from __future__ import annotations

import dataclasses
import functools
import http.server
import itertools
import json
import os
import shutil
import sys
import threading
import time
import weakref
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parent.parent
SITE = Path(os.environ.get("CVAE_DOCS_SITE") or ROOT / "site")
SHOTS = Path(os.environ.get("CVAE_DOCS_SCREENSHOTS") or ROOT / "site-screenshots")
# The implementations (key: (label, file)) and their sections, as the docs build knows them (its
# modules read files only: no MkDocs needed; they import each other plainly, as in MkDocs).
sys.path.insert(0, str(ROOT / "docs_build"))
from conformance_report import NUMBER_WORDS  # noqa: E402  (docs_build/conformance_report.py)
from repository import IMPLEMENTATIONS, SECTIONS  # noqa: E402  (docs_build/repository.py)

LABELS = [label for label, _ in IMPLEMENTATIONS.values()]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WIDE, NARROW = 1440, 800  # where a pair fits 100-character lines; where the columns are tabs
PHONE = 390  # a phone's width (its height: PHONE_HEIGHT)
PHONE_HEIGHT = 844
STORE = "rosetta.view"  # where rosetta.js keeps the reader's choice (localStorage)
SEARCH_INDEX = "search/search_index.json"  # Material's, fetched by every page


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
# The pages but the one per source file (long, and all made alike: one stands for them all).
SOURCE_PAGE = "source/impls/pure_jax.py/index.html"
CONTENT = [p for p in PAGES if not p.startswith("source/")]
COMPARE = "compare/index.html"  # every implementation file whole, two at a time
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


@functools.cache
def empty_search_index() -> dict:
    """The site's search index with no pages in it: its configuration, as the search reads it."""
    return {**json.loads((SITE / SEARCH_INDEX).read_text(encoding="utf-8")), "docs": []}


@dataclasses.dataclass
class Traffic:
    """A tab's requests since its last load began, and those not yet ended."""

    requested: list[str] = dataclasses.field(default_factory=list)
    in_flight: set = dataclasses.field(default_factory=set)


TRAFFIC: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # each tab's, by new_page()


def new_page(
    browser, base_url: str, width: int, problems: list[str], view=None, *, search=False, **options
):
    """A tab of ``width`` x 900 px (x 844 at a phone's width), in a context of its own (nothing
    stored from another test), that records console errors, uncaught exceptions, failed and
    refused requests and HTTP errors into ``problems``; requests off the site are aborted.
    ``view="all"`` opens every page on every implementation (as a reader who chose "All six"
    would have it stored). ``options`` go to Playwright's ``new_page``
    (``java_script_enabled=False``, say).

    The site's search index (about 1.9 MB, which Material's search fetches and indexes again on
    every page load) is served whole only to a tab that asks for it with ``search=True`` (the
    crawl's), and there on the tab's first load only: that load holds the index to the same
    checks as the page's (fetched, read and indexed without an error). On every later load the
    crawl's pages still request it, at the same address, and wait for it (:func:`settle`), so an
    address that a page would get wrong fails the check of that page, while the same bytes are
    not indexed again 130 times. Every other tab gets an index with no pages throughout, so that a
    load costs what its own checks read (the index was about a third of the browser's time per
    load)."""
    height = PHONE_HEIGHT if width <= PHONE else 900
    page = browser.new_page(viewport={"width": width, "height": height}, **options)
    if view is not None:
        page.add_init_script(
            f"try {{ localStorage.setItem({STORE!r}, JSON.stringify({{view: {view!r}}})) }} "
            "catch (error) {}"
        )

    whole_index = search  # served whole once, to a tab that asks for it

    def route(route):
        nonlocal whole_index
        if route.request.url == base_url + SEARCH_INDEX:
            if whole_index:
                whole_index = False
                route.continue_()
            else:
                route.fulfill(json=empty_search_index())
        elif route.request.url.startswith(base_url):
            route.continue_()
        else:
            problems.append(f"request to another host: {route.request.url}")
            route.abort()

    page.route("**/*", route)
    TRAFFIC[page] = traffic = Traffic()  # for settle()
    page.on("request", lambda r: (traffic.requested.append(r.url), traffic.in_flight.add(r)))
    for ended in ("requestfinished", "requestfailed"):  # (a bound method is not taken)
        page.on(ended, lambda r: traffic.in_flight.discard(r))
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


@functools.cache  # a function, since the scripts are defined further down
def measurements() -> dict[tuple[int, str | None], list[tuple[str, str, list[str]]]]:
    """What a visit measures, by (width, stored view): each read-only script's key, the script,
    the pages it runs on. The checks below read these; the scripts that scroll or click run in
    their own tests, on pages of their own."""
    words = ("words", WORDS_FIRST, SIDE_BY_SIDE)
    covered = ("covered", COVERED, [*CONTENT, SOURCE_PAGE])
    cells = ("cells", SPLIT_CELLS, CONTENT)
    fit = [(key, script, SIDE_BY_SIDE) for key, script in
           (("layout", LAYOUT), ("split", SPLIT_TOKENS), ("unhung", UNHUNG))]  # fmt: skip
    return {
        (WIDE, None): [
            ("sets", SETS, SIDE_BY_SIDE),
            words,
            covered,
            ("pictures", PICTURES, CONTENT),
            cells,
        ],
        (PHONE, None): [words, covered, cells],
        (WIDE, "all"): [*fit, ("all_six", ALL_SIX_FITS, TOPICS)],
        (NARROW, "all"): fit,
        (PHONE, "all"): fit,
    }


def visit(page, base_url: str, width: int, view, name: str, problems: list[str]) -> dict:
    """One load of ``name`` in ``page`` and everything ``measurements()`` reads there, with the
    problems the load met. At 1440 px with no stored view (the crawl): after the network goes
    quiet (late requests such as the search index count too), the links and ids, and the first
    screenful saved; with every implementation shown, the side-by-side page whole."""
    TRAFFIC[page].requested.clear()
    page.goto(base_url + url_path(name), wait_until="load")
    found: dict = {}
    if (width, view) == (WIDE, None):
        settle(page, base_url + SEARCH_INDEX)  # the search index, fetched late
        found["links"] = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
        found["ids"] = set(
            page.evaluate(
                "() => [...document.querySelectorAll('[id], a[name]')].map(e => e.id || e.name)"
            )
        )
    for key, script, pages in measurements().get((width, view), []):
        if name not in pages:
            continue
        if key == "covered" and page.locator("pre").count():
            # Material adds the buttons once the page has loaded
            page.wait_for_selector(".md-code__nav, .md-clipboard", state="attached", timeout=2000)
        found[key] = page.evaluate(script)
    if (width, view) == (WIDE, None):
        (SHOTS / str(WIDE)).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SHOTS / str(WIDE) / f"{slug(name)}.png")  # the first screenful
    elif view == "all" and name in SIDE_BY_SIDE:
        (SHOTS / str(width)).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SHOTS / str(width) / f"{slug(name)}.png", full_page=True)
    found["problems"] = problems[:]
    problems.clear()
    return found


QUIET = 0.1  # seconds with no request in flight after which a loaded page has settled


def settle(page, late: str, timeout: float = 5.0) -> None:
    """Wait until ``page`` (made by :func:`new_page`, loaded since its requests were emptied)
    has requested ``late`` and had no request in flight for :data:`QUIET` seconds: every request
    the load made, those its scripts make after the load event included, has ended, and its
    problems are recorded. (Playwright's ``networkidle`` waits for 500 ms of quiet, most of a
    crawl's time; the requests after a load here end within about 100 ms of it.)"""
    traffic = TRAFFIC[page]
    deadline, quiet_since = time.monotonic() + timeout, None
    while True:
        now = time.monotonic()
        if traffic.in_flight or late not in traffic.requested:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since >= QUIET:
            return
        if now > deadline:
            pending = sorted(request.url for request in traffic.in_flight)
            raise AssertionError(
                f"{page.url}: not settled after {timeout:.0f} s ({late} requested: "
                f"{late in traffic.requested}; in flight: {pending})"
            )
        page.wait_for_timeout(10)


@pytest.fixture(scope="module")
def visits(browser, base_url):
    """``visits(width, view, name)``: a page's measurements, made on its first visit at that
    width and stored view (one tab each) and read by every check that asks after it: each page
    loads once per width and view for all the read-only checks, not once per check."""
    tabs: dict = {}
    seen: dict = {}

    def measured(width: int, view, name: str) -> dict:
        if (width, view, name) not in seen:
            if (width, view) not in tabs:
                problems: list[str] = []
                crawl = (width, view) == (WIDE, None)
                page = new_page(browser, base_url, width, problems, view, search=crawl)
                tabs[width, view] = (page, problems)
            page, problems = tabs[width, view]
            seen[width, view, name] = visit(page, base_url, width, view, name, problems)
        return seen[width, view, name]

    yield measured
    for page, _ in tabs.values():
        page.close()


@pytest.fixture(scope="module")
def crawl(visits):
    """Every page loaded once at 1440 px: its problems, the links on it, the ids in it."""
    return {name: visits(WIDE, None, name) for name in PAGES}


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
def test_every_side_by_side_page_shows_every_implementation(visits, name):
    sets = visits(WIDE, None, name)["sets"]
    assert sets, f"{name} has no side-by-side tab set"
    for i, found in enumerate(sets):
        assert found["labels"] == LABELS, (name, i, found["labels"])
        assert all(length > 20 for length in found["code"]), (name, i, found["code"])


LAYOUT = r"""() => {
  const vw = document.documentElement.clientWidth;
  const box = e => { const r = e.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, width: r.width, height: r.height}; };
  const range = document.createRange();
  // A code block: how far it scrolls sideways, the room for text in it, its widest line, and the
  // lines that take more than one row on the screen (wrapped).
  const measure = c => {
    const style = getComputedStyle(c);
    const room = c.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    let widest = 0, widestChars = 0;
    const wrapped = [];
    for (const line of c.querySelectorAll(':scope > span[id^="__span"]')) {
      range.selectNodeContents(line);
      const rects = [...range.getClientRects()].filter(r => r.width > 0);
      if (!rects.length) continue;
      const text = line.textContent.replace(/\n$/, '');
      widest = Math.max(widest,
        Math.max(...rects.map(r => r.right)) - Math.min(...rects.map(r => r.left)));
      widestChars = Math.max(widestChars, text.length);
      if (new Set(rects.map(r => Math.round(r.top))).size > 1) wrapped.push(text.trim());
    }
    return {overflow: c.scrollWidth - c.clientWidth, room, widest, widestChars, wrapped,
            whiteSpace: style.whiteSpace, fontSize: parseFloat(style.fontSize)};
  };
  return {
    vw, pageOverflow: document.documentElement.scrollWidth - vw, query: location.search,
    sets: [...document.querySelectorAll('.rosetta .tabbed-set')].map(set => ({
      box: box(set),
      labels: [...set.querySelectorAll(':scope > .tabbed-labels > label')].map(l => ({
        ...box(l), text: l.textContent.trim(), shown: l.offsetHeight > 0})),
      blocks: [...set.querySelectorAll(':scope > .tabbed-content > .tabbed-block')].map(b => {
        const shown = getComputedStyle(b).display !== 'none' && b.offsetHeight > 0;
        const codes = [...b.querySelectorAll('pre > code')];
        return {...box(b), shown,
          titles: [...b.querySelectorAll('.filename')].map(t => t.textContent.trim()),
          codeTop: codes.length ? codes[0].getBoundingClientRect().top : null,
          code: shown ? codes.map(measure) : []};
      }),
    })),
  };
}"""

# Every name (and every other token that is neither a comment nor a string and holds no space)
# in the code shown, that the screen shows on more than one row: broken inside.
SPLIT_TOKENS = r"""() => {
  const split = [];
  const range = document.createRange();
  const rows = () => new Set([...range.getClientRects()].filter(r => r.width > 0)
    .map(r => Math.round(r.top))).size;
  for (const line of document.querySelectorAll('.rosetta code > span[id^="__span"]')) {
    if (!line.getClientRects().length) continue;  // in a hidden tab
    const nodes = [];
    const walker = document.createTreeWalker(line, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(), at = 0; n; at += n.data.length, n = walker.nextNode())
      nodes.push([n, at]);
    const text = nodes.map(([n]) => n.data).join('');
    // The text node and offset of a position in the line (an end may close a node).
    const place = (offset, end) => {
      const [n, at] = nodes.find(([n, at]) => offset - at < n.data.length + (end ? 1 : 0));
      return [n, offset - at];
    };
    for (const m of text.matchAll(/[A-Za-z_][A-Za-z0-9_]*/g)) {
      range.setStart(...place(m.index, false));
      range.setEnd(...place(m.index + m[0].length, true));
      if (rows() > 1) split.push(`${m[0]} in: ${text.trim()}`);
    }
    for (const token of line.querySelectorAll('span[class]')) {
      if (/^[cs]/.test(token.className) || /\s/.test(token.textContent)) continue;
      range.selectNodeContents(token);
      if (rows() > 1) split.push(`${token.textContent} in: ${text.trim()}`);
    }
  }
  return split;
}"""


# Every wrapped line of the code shown whose continuation rows do not start right of where the
# line's code starts (its first character after the indentation) by at least two characters.
UNHUNG = r"""() => {
  const bad = [];
  const range = document.createRange();
  for (const line of document.querySelectorAll('.rosetta code > span[id^="__span"]')) {
    if (!line.getClientRects().length) continue;  // in a hidden tab
    range.selectNodeContents(line);
    const rects = [...range.getClientRects()].filter(r => r.width > 0);
    const tops = [...new Set(rects.map(r => Math.round(r.top)))].sort((a, b) => a - b);
    if (tops.length < 2) continue;
    const walker = document.createTreeWalker(line, NodeFilter.SHOW_TEXT);
    let first = null;
    for (let n = walker.nextNode(); n && !first; n = walker.nextNode()) {
      const at = n.data.search(/\S/);
      if (at >= 0) first = [n, at];
    }
    if (!first) continue;
    range.setStart(first[0], first[1]);
    range.setEnd(first[0], first[1] + 1);
    const start = range.getBoundingClientRect();
    const rest = rects.filter(r => Math.round(r.top) > tops[0] && r.width > 1);
    const left = Math.min(...rest.map(r => r.left));
    if (left < start.left + 2 * start.width - 1)
      bad.push(`${line.textContent.trim().slice(0, 60)} (code at ${start.left.toFixed(0)} px, ` +
               `continued at ${left.toFixed(0)} px)`);
  }
  return bad;
}"""


def check_columns(layout, name: str) -> None:
    """Every implementation, one column each, side by side within the page and under its label."""
    for i, s in enumerate(layout["sets"]):
        where = f"{name} tab set {i}"
        blocks, labels = s["blocks"], s["labels"]
        assert [b["shown"] for b in blocks] == [True] * len(LABELS), where
        assert [label["text"] for label in labels if label["shown"]] == LABELS, where
        assert max(b["top"] for b in blocks) - min(b["top"] for b in blocks) < 1, where
        lefts = [b["left"] for b in blocks]
        assert lefts == sorted(lefts) and len(set(lefts)) == len(LABELS), (where, lefts)
        for b, label in zip(blocks, labels, strict=True):
            assert b["width"] > 150, (where, b)
            assert s["box"]["left"] - 1 <= b["left"] and b["right"] <= s["box"]["right"] + 1, where
            assert abs(label["left"] - b["left"]) < 2, (where, "label not above its column")
        assert s["box"]["right"] <= layout["vw"] + 1, where


def check_tabs(layout, name: str) -> None:
    for i, s in enumerate(layout["sets"]):
        where = f"{name} tab set {i}"
        assert sum(b["shown"] for b in s["blocks"]) == 1, where
        assert all(label["width"] > 0 for label in s["labels"]), where
        shown = next(b for b in s["blocks"] if b["shown"])
        assert shown["right"] <= s["box"]["right"] + 1, where
        assert s["box"]["right"] <= layout["vw"] + 1, where


def check_pair(layout, pair: tuple[str, str], name: str, *, columns: bool) -> None:
    """Exactly the two chosen implementations, the first on the left (or above, stacked) and
    the second beside it (or below), the same width, top-aligned side by side; side by side no
    code line wraps and every line fits in its column (nothing to scroll)."""
    order = list(IMPLEMENTATIONS)
    assert layout["query"] == f"?a={pair[0]}&b={pair[1]}", (name, layout["query"])
    assert layout["pageOverflow"] <= 0, f"{name}: page {layout['pageOverflow']} px too wide"
    for i, s in enumerate(layout["sets"]):
        where = f"{name} tab set {i}, {pair}"
        along = "left" if columns else "top"
        shown = [n for n, b in enumerate(s["blocks"]) if b["shown"]]
        shown.sort(key=lambda n: s["blocks"][n][along])
        assert shown == [order.index(key) for key in pair], where
        first, second = (s["blocks"][n] for n in shown)
        assert abs(first["width"] - second["width"]) < 1, where
        assert first["right"] <= s["box"]["right"] + 1 and second["right"] <= s["box"]["right"] + 1
        if columns:
            labels = sorted((x for x in s["labels"] if x["shown"]), key=lambda x: x["left"])
            assert [x["text"] for x in labels] == [IMPLEMENTATIONS[k][0] for k in pair], where
            assert first["right"] <= second["left"], where
            assert abs(first["top"] - second["top"]) < 1, (where, "not top-aligned")
            assert abs(first["codeTop"] - second["codeTop"]) < 1, (where, "code not top-aligned")
        else:
            assert abs(first["left"] - second["left"]) < 1 and first["top"] < second["top"], where
        for block in (first, second):
            for code in block["code"]:
                if columns:  # stacked, long lines wrap (checked by the reading tests)
                    assert code["whiteSpace"] == "pre", (where, code["whiteSpace"])
                    assert not code["wrapped"], (where, "wrapped", code["wrapped"][:3])
                    assert code["overflow"] <= 0, (where, "a line wider than its column", code)


@pytest.mark.parametrize("width", [WIDE, NARROW, PHONE])
def test_side_by_side_pages_fit_the_screen(visits, width):
    """All of them as columns at 1440 px, as tabs at 800 and 390 px; nothing wider than the
    window, no code line broken inside a name or any other token, and every wrapped line hangs
    right of where its code starts."""
    failures, problems = [], []
    for name in SIDE_BY_SIDE:
        found = visits(width, "all", name)
        layout, split, unhung = found["layout"], found["split"], found["unhung"]
        problems += found["problems"]
        try:
            assert layout["pageOverflow"] <= 0, f"{name}: page {layout['pageOverflow']} px too wide"
            assert not split, f"{name}: broken inside a token: {split[:3]}"
            assert not unhung, f"{name}: wrapped without a hanging indent: {unhung[:3]}"
            (check_columns if width == WIDE else check_tabs)(layout, name)
        except AssertionError as error:
            failures.append(str(error))
    assert not failures, "\n".join(failures)
    assert not problems, problems


def test_choosing_a_tab_switches_every_tab_set_and_is_remembered(browser, base_url):
    problems: list[str] = []
    page = new_page(browser, base_url, NARROW, problems, view="all")
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


# --- two implementations -------------------------------------------------------------------------


def pick(page, left: str, right: str) -> None:
    """Choose a pair the way a reader does: the left one, then the right one, in the two lists
    above the code (choosing in one list the implementation the other shows swaps them)."""
    page.select_option(".rosetta-view select[name=a]", left)
    page.select_option(".rosetta-view select[name=b]", right)


def headings(page) -> list[str]:
    return page.eval_on_selector_all(
        ".md-content h2", "hs => hs.map(h => h.firstChild.textContent.trim())"
    )


# For every tab set of a pair shown as two columns: per side, the definitions of its code (def and
# class NAME, a top-level NAME =), each with the top of its first line (its first decorator).
DEFINITIONS = r"""() => [...document.querySelectorAll('.rosetta[data-view="pair"] .tabbed-set')]
  .map(set => ['a', 'b'].map(side => {
    const code = set.querySelector(`.tabbed-content > [data-side="${side}"] pre > code`);
    if (!code) return [];
    const lines = [...code.querySelectorAll(':scope > span[id^="__span"]')];
    const found = [];
    lines.forEach((line, i) => {
      const m = /^\s*(?:async\s+)?(?:def|class)\s+(\w+)|^([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)/
        .exec(line.textContent);
      if (!m) return;
      let first = i;
      while (first > 0 && /^\s*@/.test(lines[first - 1].textContent)) first -= 1;
      found.push([m[1] ? `def ${m[1]}` : `${m[2]} =`,
                  lines[first].getBoundingClientRect().top + window.scrollY]);
    });
    return found;
  }))"""


def longest_common(a: list[str], b: list[str]) -> int:
    """The length of the longest sequence of items that ``a`` and ``b`` both hold in order."""
    best = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) - 1, -1, -1):
        for j in range(len(b) - 1, -1, -1):
            best[i][j] = (
                best[i + 1][j + 1] + 1 if a[i] == b[j] else max(best[i + 1][j], best[i][j + 1])
            )
    return best[0][0]


def misaligned(sets) -> list[str]:
    """Each tab set whose two columns hold fewer pairs of the same definition on the same row
    than the longest run of definitions both hold in the same order."""
    bad = []
    for n, (a, b) in enumerate(sets):
        want = longest_common([k for k, _ in a], [k for k, _ in b])
        rows = {(k, round(top)) for k, top in a}
        level = sum(
            1
            for k, top in b
            if (k, round(top)) in rows or (k, round(top) - 1) in rows or (k, round(top) + 1) in rows
        )
        if level < want:
            bad.append(f"tab set {n}: {level} of {want} shared definitions side by side")
    return bad


def test_the_compare_page_shows_every_pair_chosen_by_the_controls(browser, base_url):
    """Every ordered pair of them, chosen with the controls on the compare page at 1440 px:
    the two files' openings and sections, each beside the same one of the other, aligned and
    unwrapped, the definitions both hold in the same order on the same rows; the address names
    the pair, and opening it elsewhere shows the same view."""
    shots = SHOTS / "pair"
    shots.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    page = new_page(browser, base_url, WIDE, problems)
    page.goto(base_url + url_path(COMPARE))
    assert headings(page) == ["Docstring and imports", *SECTIONS]
    check_pair(page.evaluate(LAYOUT), ("flax_linen", "flax_nnx"), "compare (default)", columns=True)
    page.screenshot(path=shots / "compare-default.png")
    measured, failures = {}, []
    for left, right in itertools.permutations(IMPLEMENTATIONS, 2):
        pick(page, left, right)
        layout = page.evaluate(LAYOUT)
        try:
            check_pair(layout, (left, right), "compare", columns=True)
        except AssertionError as error:
            failures.append(str(error))
        failures += [f"compare {left, right}: {m}" for m in misaligned(page.evaluate(DEFINITIONS))]
        for s in layout["sets"]:
            blocks = sorted((b for b in s["blocks"] if b["shown"]), key=lambda b: b["left"])
            titles = [title for b in blocks for title in b["titles"]]
            files = [IMPLEMENTATIONS[key][1] for key in (left, right)]
            if [t.split(" · ")[0] for t in titles] != files:
                failures.append(f"compare {left, right}: titles {titles}")
        codes = [c for s in layout["sets"] for b in s["blocks"] if b["shown"] for c in b["code"]]
        measured[f"{left} | {right}"] = {
            "font_px": round(codes[0]["fontSize"], 2),
            "column_px": round(min(c["room"] for c in codes), 1),
            "widest_line_px": round(max(c["widest"] for c in codes), 1),
            "widest_line_chars": max(c["widestChars"] for c in codes),
        }
        if left < right:
            page.evaluate("document.getElementById('forward').scrollIntoView()")
            page.screenshot(path=shots / f"compare-{left}-{right}-forward.png")
    (shots / "measurements.json").write_text(json.dumps(measured, indent=2) + "\n")
    assert not failures, "\n".join(failures[:10])

    swapped = tuple(reversed(list(itertools.permutations(IMPLEMENTATIONS, 2))[-1]))
    page.click(".rosetta-view .rosetta-swap")  # the last pair picked, the other way round
    check_pair(page.evaluate(LAYOUT), swapped, "compare (swapped)", columns=True)
    link = page.url
    page.close()

    again = new_page(browser, base_url, WIDE, problems)  # a new context: nothing remembered
    again.goto(link)
    check_pair(again.evaluate(LAYOUT), swapped, f"{link} opened anew", columns=True)
    again.screenshot(path=shots / "compare-from-link.png")
    again.close()
    assert not problems, problems


def test_every_side_by_side_page_offers_the_pair_and_remembers_it(browser, base_url):
    """On a topic page: a pair at first (Flax Linen against Flax NNX); the two lists choose
    another, which every topic and tour page then shows (and its address names), and which the
    link to the whole files carries to the compare page; "All six" shows every column, on every
    page, in one click, and "Two" brings the pair back."""
    shots = SHOTS / "pair"
    shots.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    page = new_page(browser, base_url, WIDE, problems)
    first = SIDE_BY_SIDE[0]
    page.goto(base_url + url_path(first))
    assert page.is_checked(".rosetta-view input[value=pair]")
    check_pair(page.evaluate(LAYOUT), ("flax_linen", "flax_nnx"), first, columns=True)
    page.get_by_label(f"All {NUMBER_WORDS[len(LABELS)]}").check()
    check_columns(page.evaluate(LAYOUT), first)
    page.get_by_label("Two:").check()
    check_pair(page.evaluate(LAYOUT), ("flax_linen", "flax_nnx"), first, columns=True)
    pick(page, "haiku", "pure_jax")
    failures = []
    for name in SIDE_BY_SIDE:
        page.goto(base_url + url_path(name))
        layout = page.evaluate(LAYOUT)
        page.screenshot(path=shots / f"{slug(name)}.png", full_page=True)
        try:
            check_pair(layout, ("haiku", "pure_jax"), name, columns=True)
        except AssertionError as error:
            failures.append(str(error))
    assert not failures, "\n".join(failures)

    page.click(".rosetta-view .rosetta-whole")
    page.wait_for_load_state()
    assert page.url.startswith(base_url + url_path(COMPARE)), page.url
    check_pair(page.evaluate(LAYOUT), ("haiku", "pure_jax"), "compare from a topic", columns=True)

    page.goto(base_url + url_path(first))
    page.get_by_label(f"All {NUMBER_WORDS[len(LABELS)]}").check()
    assert page.evaluate("location.search") == ""
    for name in (first, SIDE_BY_SIDE[-1]):
        page.goto(base_url + url_path(name))
        check_columns(page.evaluate(LAYOUT), name)
    page.close()
    assert not problems, problems


@pytest.mark.parametrize("width", [NARROW, PHONE])
def test_a_pair_stacks_on_a_narrow_screen(browser, base_url, width):
    """At 800 and 390 px the two stand one above the other, each as wide as the page; long
    lines wrap between tokens, never inside one, and hang right of where their code starts."""
    shots = SHOTS / "pair"
    shots.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    page = new_page(browser, base_url, width, problems)
    failures = []
    for name in (COMPARE, *SIDE_BY_SIDE):
        page.goto(base_url + url_path(name) + "?a=equinox&b=flax_linen")
        try:
            check_pair(page.evaluate(LAYOUT), ("equinox", "flax_linen"), name, columns=False)
            split, unhung = page.evaluate(SPLIT_TOKENS), page.evaluate(UNHUNG)
            assert not split, f"{name}: broken inside a token: {split[:3]}"
            assert not unhung, f"{name}: wrapped without a hanging indent: {unhung[:3]}"
        except AssertionError as error:
            failures.append(str(error))
        if name in (COMPARE, SIDE_BY_SIDE[0]):
            page.screenshot(path=shots / f"{slug(name)}-{width}.png")
    page.close()
    assert not failures, "\n".join(failures)
    assert not problems, problems


def test_without_javascript_the_compare_page_shows_them_all(browser, base_url):
    problems: list[str] = []
    page = new_page(browser, base_url, WIDE, problems, java_script_enabled=False)
    page.goto(base_url + url_path(COMPARE))
    layout = page.evaluate(LAYOUT)  # evaluate runs even where the page's own scripts do not
    assert len(layout["sets"]) == 1 + len(SECTIONS)
    check_columns(layout, "compare without JavaScript")
    assert page.locator(".rosetta-view").count() == 0
    page.close()
    assert not problems, problems


# --- pages of tables -----------------------------------------------------------------------------

CHOOSING, PERFORMANCE = "choosing/index.html", "performance/index.html"
DECISION = "the-decision"  # the id of the choosing page's h2 whose table opens the page
SCREEN = 900  # the window's height: the decision table must begin within the first screenful
TALLEST = 8000  # px: the choosing page whole, at 1440 px wide

# The text column, the page's height and every table in the column: its top from the top of the
# page, its width and scroll width, the h2 it stands under, and how far each box around it (the
# table itself, Material's .md-typeset__table and .md-typeset__scrollwrap) scrolls sideways.
TABLES = r"""() => {
  const column = document.querySelector('.md-content__inner');
  const h2s = [...column.querySelectorAll('h2')];
  const after = (a, b) => a.compareDocumentPosition(b) & Node.DOCUMENT_POSITION_FOLLOWING;
  return {
    column: column.clientWidth,
    height: document.documentElement.scrollHeight,
    pageOverflow: document.documentElement.scrollWidth - document.documentElement.clientWidth,
    h2: h2s.map(h => h.id),
    tables: [...column.querySelectorAll('table')].map(t => {
      const r = t.getBoundingClientRect();
      const under = h2s.filter(h => after(h, t)).pop();
      const boxes = [t, t.closest('.md-typeset__table'), t.closest('.md-typeset__scrollwrap')];
      return {
        top: Math.round(r.top + window.scrollY), width: Math.round(r.width),
        scrollWidth: t.scrollWidth, h2: under ? under.id : null,
        scrolls: Math.max(...boxes.filter(Boolean).map(b => b.scrollWidth - b.clientWidth)),
        head: (t.querySelector('tr') || {textContent: ''}).textContent.replace(/\s+/g, ' ').trim()
          .slice(0, 50),
      };
    }),
  };
}"""


def measure_tables(browser, base_url, name: str) -> dict:
    """``TABLES`` of a page at 1440 x 900 px, saved with a screenshot of the whole page in
    ``layout/`` (the page's problems too: it must load cleanly)."""
    shots = SHOTS / "layout"
    shots.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    page = new_page(browser, base_url, WIDE, problems)
    page.goto(base_url + url_path(name), wait_until="load")
    layout = page.evaluate(TABLES)
    page.screenshot(path=shots / f"{slug(name)}.png", full_page=True)
    page.close()
    layout["problems"] = problems
    (shots / f"{slug(name)}.json").write_text(json.dumps(layout, indent=2) + "\n")
    return layout


def wide_tables(layout) -> list[str]:
    """Every table wider than the text column or scrolling sideways, with its measurements."""
    return [
        f"table {i} (under #{t['h2']}, top {t['top']} px, '{t['head']}'): "
        f"{t['scrollWidth']} px wide in a {layout['column']} px column, scrolls {t['scrolls']} px"
        for i, t in enumerate(layout["tables"])
        if t["scrollWidth"] > layout["column"] or t["scrolls"] > 0
    ]


@pytest.mark.skipif(CHOOSING not in PAGES, reason="no choosing page in the built site")
def test_the_choosing_page_opens_on_the_decision_and_fits_the_screen(browser, base_url):
    """At 1440 x 900 px: the page's first table is the decision's (under the h2 #the-decision) and
    begins within the first screenful; the page is at most TALLEST px tall; no table is wider than
    the text column or scrolls sideways (the measurements go to layout/choosing.json)."""
    layout = measure_tables(browser, base_url, CHOOSING)
    failures = []
    if DECISION not in layout["h2"]:
        failures.append(f"no h2 #{DECISION} (the page's h2s: {layout['h2']})")
    if not layout["tables"]:
        failures.append("no table at all")
    else:
        first = layout["tables"][0]
        if first["h2"] != DECISION:
            failures.append(f"the first table stands under #{first['h2']}, not #{DECISION}")
        if first["top"] >= SCREEN:
            failures.append(f"the first table begins {first['top']} px down, not within {SCREEN}")
    if layout["height"] > TALLEST:
        failures.append(f"the page is {layout['height']} px tall, more than {TALLEST}")
    if layout["pageOverflow"] > 0:
        failures.append(f"the page is {layout['pageOverflow']} px wider than the window")
    failures += wide_tables(layout)
    assert not failures, "\n".join(failures)
    assert not layout["problems"], layout["problems"]


# Each decision row at a phone's width: the card's top, the bottom of its need, its choice and the
# first piece of its evidence (up to the first line break), and how far it reaches sideways.
CARDS = r"""() => [...document.querySelectorAll('.decision tbody tr')].map(tr => {
  const [need, use, evidence] = tr.children;
  const first = document.createRange();
  first.setStart(evidence, 0);
  const br = evidence.querySelector('br');
  if (br) first.setEndBefore(br); else first.setEnd(evidence, evidence.childNodes.length);
  const root = document.documentElement, box = tr.getBoundingClientRect();
  return {need: need.textContent.trim(), top: box.top, right: box.right, view: root.clientWidth,
          bottom: Math.max(use.getBoundingClientRect().bottom,
                           first.getBoundingClientRect().bottom),
          pageOverflow: root.scrollWidth - root.clientWidth};
})"""


@pytest.mark.skipif(CHOOSING not in PAGES, reason="no choosing page in the built site")
def test_each_decision_row_reads_as_a_card_on_a_phone(browser, base_url):
    """At 390 x 844 px every row of the decision table is a card whose need, choice and first
    piece of evidence fit one screen, and nothing reaches past the window's width."""
    problems: list[str] = []
    page = new_page(browser, base_url, PHONE, problems)
    page.goto(base_url + url_path(CHOOSING), wait_until="load")
    cards = page.evaluate(CARDS)
    page.close()
    assert len(cards) >= 8, cards
    failures = [
        f"{c['need']}: need, choice and first evidence take {c['bottom'] - c['top']:.0f} px"
        for c in cards
        if c["bottom"] - c["top"] > PHONE_HEIGHT
    ]
    failures += [f"{c['need']}: reaches {c['right']:.0f} px of {c['view']}" for c in cards
                 if c["right"] > c["view"] + 0.5]  # fmt: skip
    if cards and cards[0]["pageOverflow"] > 0:
        failures.append(f"the page is {cards[0]['pageOverflow']} px wider than the window")
    assert not failures, "\n".join(failures)
    assert not problems, problems


@pytest.mark.skipif(PERFORMANCE not in PAGES, reason="no performance page in the built site")
def test_no_table_on_the_performance_page_scrolls_sideways(browser, base_url):
    """At 1440 x 900 px every table of the performance page fits its text column (the
    measurements go to layout/performance.json)."""
    layout = measure_tables(browser, base_url, PERFORMANCE)
    failures = wide_tables(layout)
    assert not failures, f"{len(failures)} of {len(layout['tables'])} tables:\n" + "\n".join(
        failures
    )
    assert not layout["problems"], layout["problems"]


# --- reading: words first, the compare page's notes, labels in view, copy buttons, pictures ---

TOPICS = [p for p in SIDE_BY_SIDE if p.startswith("topics/")]
READING = [WIDE, PHONE]  # the widths the reading checks run at (x 900 and x 844 px)

# Before the first code of the page's content: the paragraphs, the bold words of the bullets
# (a differences list names each implementation so), and whether any code comes at all.
WORDS_FIRST = r"""() => {
  const content = document.querySelector('.md-content__inner');
  const code = content.querySelector('pre, .rosetta, .highlight');
  const before = e => !code ||
    (e.compareDocumentPosition(code) & Node.DOCUMENT_POSITION_FOLLOWING);
  const shown = e => e.offsetHeight > 0;
  return {
    code: Boolean(code),
    paragraphs: [...content.querySelectorAll('p')].filter(p => before(p) && shown(p)
      && !p.closest('.rosetta-view')).map(p => p.textContent.trim()).filter(t => t.length > 40),
    labelled: [...content.querySelectorAll('li')].filter(li => before(li) && shown(li))
      .flatMap(li => [...li.querySelectorAll(':scope > strong, :scope > p > strong')])
      .map(strong => strong.textContent.trim()),
  };
}"""


@pytest.mark.parametrize("width", READING)
def test_every_side_by_side_page_says_what_differs_before_the_code(visits, width):
    """On every topic and tour page a paragraph comes before the first code; on every topic
    page, also a list that names every implementation by its label, one bullet at a time."""
    failures, problems = [], []
    for name in SIDE_BY_SIDE:
        measured = visits(width, None, name)
        problems += measured["problems"]
        found = measured["words"]
        if not found["code"]:
            failures.append(f"{name}: no code at all")
        if not found["paragraphs"]:
            failures.append(f"{name}: no paragraph before the first code")
        named = {label.lower() for label in found["labelled"]}
        missing = [label for label in LABELS if label.lower() not in named]
        if name in TOPICS and missing:
            failures.append(f"{name}: before the code, no bullet names {missing}")
    assert not failures, "\n".join(failures)
    assert not problems, problems


# Under each h2 of the compare page: the section's explanation and its link, and the notes on
# what differs that show (their implementations, in the order shown).
COMPARE_WORDS = r"""() => [...document.querySelectorAll('.md-content h2')].map(h => {
  const about = h.nextElementSibling;
  const after = about && about.nextElementSibling;
  const contrasts = after && after.classList.contains('rosetta-contrasts') ? after : null;
  const differs = contrasts ? contrasts.nextElementSibling : about && about.nextElementSibling;
  const notes = differs && differs.classList.contains('rosetta-differs')
    ? [...differs.querySelectorAll('.rosetta-differ')].filter(n => n.offsetHeight > 0)
        .sort((x, y) => x.getBoundingClientRect().top - y.getBoundingClientRect().top)
    : [];
  return {
    id: h.id,
    about: about && about.classList.contains('rosetta-section-about')
      ? about.textContent.trim() : null,
    links: about ? [...about.querySelectorAll('a[href]')].map(a => a.pathname) : [],
    notes: notes.map(n => ({impls: n.dataset.impls.split(' '), text: n.textContent.trim()})),
    contrasts: contrasts ? [...contrasts.querySelectorAll('.rosetta-contrast')]
      .filter(c => c.offsetHeight > 0).map(c => ({pair: c.dataset.pair,
                                                   text: c.textContent.trim()})) : [],
  };
})"""


@pytest.mark.parametrize("width", READING)
def test_every_compare_section_explains_itself_for_every_pair(browser, base_url, width):
    """Every section of the compare page says what it holds and links to its topic page; for
    every pair, chosen with the controls, the opening and each section show one contrast line, the
    chosen pair's (the left one named first), and what differs for the two chosen and for no
    other: the left one's note first (one note where a single note covers both)."""
    problems: list[str] = []
    page = new_page(browser, base_url, width, problems)
    page.goto(base_url + url_path(COMPARE))
    failures = []
    for section in page.evaluate(COMPARE_WORDS):
        if section["id"] not in SECTIONS:
            continue
        if not section["about"] or len(section["about"]) < 30:
            failures.append(f"{section['id']}: no explanation ({section['about']!r})")
        if not any("/topics/" in link for link in section["links"]):
            failures.append(f"{section['id']}: no link to a topic page ({section['links']})")
    pairs = list(itertools.combinations(IMPLEMENTATIONS, 2))
    for left, right in [*pairs, tuple(reversed(pairs[-1]))]:
        pick(page, left, right)
        every = page.evaluate(COMPARE_WORDS)
        labels = dict(zip(IMPLEMENTATIONS, LABELS, strict=True))
        for section in every:
            lines = section["contrasts"]
            where = f"{left, right}, {section['id']}"
            if [line["pair"] for line in lines] != [f"{left} {right}"]:
                failures.append(f"{where}: contrast lines shown: {lines}")
            elif not (
                0
                < lines[0]["text"].lower().index(labels[left].lower())
                < lines[0]["text"].lower().index(labels[right].lower())
            ):
                failures.append(f"{where}: the contrast does not name the left one first")
        sections = [s for s in every if s["id"] in SECTIONS]
        if [s["id"] for s in sections] != SECTIONS:
            failures.append(f"{left, right}: sections {[s['id'] for s in sections]}")
        for section in sections:
            shown = [set(note["impls"]) for note in section["notes"]]
            where = f"{left, right}, {section['id']}"
            if not shown or not all(n & {left, right} for n in shown):
                failures.append(f"{where}: notes for {shown}")
            elif {left, right} - set().union(*shown):
                failures.append(f"{where}: no note for { ({left, right} - set().union(*shown)) }")
            elif left not in shown[0]:
                failures.append(f"{where}: the first note is for {shown[0]}, not {left}")
            if any(len(note["text"]) < 20 for note in section["notes"]):
                failures.append(f"{where}: an empty note")
    (SHOTS / "reading").mkdir(parents=True, exist_ok=True)
    page.evaluate("document.getElementById('module').scrollIntoView()")
    page.screenshot(path=SHOTS / "reading" / f"compare-module-{width}.png")
    page.close()
    assert not failures, "\n".join(failures[:20])
    assert not problems, problems


# For the tallest code block of the page's side-by-side tab sets: scroll its middle to the
# middle of the window, then for every block of that set that shows, what names it (the column's
# label; in tabs the chosen tab's label; stacked, the block's title): whether it is inside the
# window below the header and not covered by anything.
MID_BLOCK = r"""() => {
  const header = document.querySelector('.md-header').getBoundingClientRect().bottom;
  const blocks = [...document.querySelectorAll('.rosetta .tabbed-block')]
    .filter(b => b.offsetHeight > 0);
  const tallest = blocks.reduce((a, b) => (b.offsetHeight > a.offsetHeight ? b : a));
  const r = tallest.getBoundingClientRect();
  window.scrollBy(0, r.top + r.height / 2 - window.innerHeight / 2);
  const set = tallest.closest('.tabbed-set');
  const shown = [...set.querySelectorAll(':scope > .tabbed-content > .tabbed-block')]
    .map((b, i) => [b, i]).filter(([b]) => b.offsetHeight > 0);
  const labels = [...set.querySelectorAll(':scope > .tabbed-labels > label')];
  // stacked, only the blocks across the middle of the window, each by the title of its code
  // block there (a tab may hold more than one)
  const middle = window.innerHeight / 2;
  const across = e => { const q = e.getBoundingClientRect();
                        return q.top <= middle && middle <= q.bottom; };
  return {height: Math.round(r.height), names: shown.filter(([b, i]) => {
    const label = labels[i];
    return (label && label.offsetHeight > 0) || across(b);
  }).map(([b, i]) => {
    const label = labels[i];
    const name = label && label.offsetHeight > 0 ? label
      : ([...b.querySelectorAll('.highlight')].find(across) || b).querySelector('.filename');
    const box = name.getBoundingClientRect();
    const hit = document.elementFromPoint(box.left + box.width / 2, box.top + box.height / 2);
    return {text: name.textContent.trim(), top: box.top, bottom: box.bottom, header,
            height: window.innerHeight,
            // a column's label lets the pointer through to its row (pointer-events: none)
            uncovered: Boolean(hit && (name.contains(hit) || hit === name.parentElement))};
  })};
}"""


@pytest.mark.parametrize("view", ["pair", "all"])
@pytest.mark.parametrize("width", READING)
def test_the_labels_stay_in_view_at_mid_block(browser, base_url, width, view):
    """Halfway down the longest code block of the compare page and of the topic pages, what
    names each column (its label, the chosen tab, or a stacked block's title) is in the window,
    under the header, uncovered."""
    (SHOTS / "reading").mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    page = new_page(browser, base_url, width, problems, view=view)
    failures = []
    for name in [COMPARE, *TOPICS] if view == "pair" else TOPICS:
        page.goto(base_url + url_path(name))
        found = page.evaluate(MID_BLOCK)
        if found["height"] < page.viewport_size["height"]:
            continue  # the whole block fits in the window: nothing scrolls away
        for label in found["names"]:
            inside = label["header"] - 1 <= label["top"] and label["bottom"] <= label["height"]
            if not (inside and label["uncovered"]):
                failures.append(f"{name}, {view}: {label}")
        if name in (COMPARE, "topics/modules/index.html"):
            page.screenshot(path=SHOTS / "reading" / f"{slug(name)}-{view}-{width}-mid.png")
    page.close()
    assert not failures, "\n".join(failures)
    assert not problems, problems


# Every copy button that shows, and the text of its code block under it (the rectangles of the
# characters it covers).
COVERED = r"""() => {
  const range = document.createRange();
  const overlaps = (a, b) => a.left < b.right - 0.5 && b.left < a.right - 0.5 &&
    a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5;
  const bad = [];
  for (const nav of document.querySelectorAll('.md-code__nav, .md-clipboard')) {
    if (!nav.offsetHeight) continue;
    const box = nav.getBoundingClientRect();
    const block = nav.closest('.highlight') || nav.closest('pre');
    for (const code of block.querySelectorAll('code')) {
      range.selectNodeContents(code);
      const hit = [...range.getClientRects()].find(r => r.width > 0 && overlaps(r, box));
      if (hit) { bad.push(code.textContent.trim().split('\n')[0].slice(0, 60)); break; }
    }
  }
  return bad;
}"""


@pytest.mark.parametrize("width", READING)
def test_no_copy_button_covers_code(visits, width):
    """On every page but the source files' own (long, and made like the others), no copy button
    lies over the text of its code block."""
    failures, problems = [], []
    for name in [*CONTENT, SOURCE_PAGE]:
        measured = visits(width, None, name)
        problems += measured["problems"]
        covered = measured["covered"]
        if covered:
            failures.append(f"{name}: {covered[:3]}")
    assert not failures, "\n".join(failures)
    assert not problems, problems


# Every picture in the page's content: its size on the screen and the size it was drawn at.
PICTURES = r"""() => [...document.querySelectorAll('.md-content img')].map(img => ({
  src: img.getAttribute('src'), shown: img.clientWidth, natural: img.naturalWidth,
  column: img.closest('.md-content__inner').clientWidth,
}))"""


def test_pictures_are_shown_at_the_size_they_were_drawn_for(visits):
    """At 1440 px, every picture on every page is shown at its drawn width or at half of it (a
    picture drawn at twice the size for sharp screens), and fits the text column."""
    failures, seen, problems = [], 0, []
    for name in CONTENT:
        measured = visits(WIDE, None, name)
        problems += measured["problems"]
        for picture in measured["pictures"]:
            seen += 1
            scale = picture["natural"] / max(picture["shown"], 1)
            if not (abs(scale - 1) < 0.01 or abs(scale - 2) < 0.01):
                failures.append(f"{name}: {picture}")
            if picture["shown"] > picture["column"]:
                failures.append(f"{name}: wider than the column: {picture}")
    assert seen >= 3, f"only {seen} pictures found"
    assert not failures, "\n".join(failures)
    assert not problems, problems


HOME_CARDS = r"""() => [...document.querySelectorAll('.md-content .grid.cards > ul > li')]
  .map(li => ({
  text: li.textContent.replace(/\s+/g, ' ').trim(),
  links: [...li.querySelectorAll('a[href]')].map(a => a.pathname + a.search),
}))"""


def test_the_home_page_introduces_every_implementation(browser, base_url):
    """The home page opens with one card per implementation, each with its label, a link to
    its implementation file's page and a link to its compare view (a pair that holds it)."""
    problems: list[str] = []
    page = new_page(browser, base_url, WIDE, problems)
    page.goto(base_url)
    cards = page.evaluate(HOME_CARDS)
    page.screenshot(path=SHOTS / "reading" / "home-1440.png", full_page=True)
    page.close()
    assert len(cards) == len(IMPLEMENTATIONS), [c["text"][:40] for c in cards]
    for (key, (label, source)), card in zip(IMPLEMENTATIONS.items(), cards, strict=True):
        assert card["text"].lower().startswith(label.lower()) or label in card["text"], card
        assert any(link.endswith(f"/source/{source}/") for link in card["links"]), (key, card)
        compare = [link for link in card["links"] if "/compare/?" in link]
        assert any(f"a={key}&" in link or link.endswith(f"b={key}") for link in compare), card
    assert not problems, problems


# Every name (or name=) in inline code in the cells of the page's tables that the screen shows
# on more than one row: split inside.
SPLIT_CELLS = r"""() => {
  const range = document.createRange();
  const split = [];
  for (const code of document.querySelectorAll('.md-content td code, .md-content th code')) {
    const nodes = [];
    const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(), at = 0; n; at += n.data.length, n = walker.nextNode())
      nodes.push([n, at]);
    const text = nodes.map(([n]) => n.data).join('');
    const place = (offset, end) => {
      const [n, at] = nodes.find(([n, at]) => offset - at < n.data.length + (end ? 1 : 0));
      return [n, offset - at];
    };
    for (const m of text.matchAll(/[A-Za-z_][A-Za-z0-9_]*=?/g)) {
      range.setStart(...place(m.index, false));
      range.setEnd(...place(m.index + m[0].length, true));
      const rows = new Set([...range.getClientRects()].filter(r => r.width > 0)
        .map(r => Math.round(r.top))).size;
      if (rows > 1) split.push(`${m[0]} in ${text}`);
    }
  }
  return split;
}"""


@pytest.mark.parametrize("width", READING)
def test_no_name_in_a_table_is_split(visits, width):
    """In every table of every page, inline code (a name, ``rngs=``, ``batch_stats``) stays on
    one row; a table too wide for a phone scrolls sideways instead."""
    failures, problems = [], []
    for name in CONTENT:
        measured = visits(width, None, name)
        problems += measured["problems"]
        split = measured["cells"]
        if split:
            failures.append(f"{name}: {split[:4]}")
    assert not failures, "\n".join(failures)
    assert not problems, problems


# --- every screen: tables on a phone, copy buttons that take the tap, "All six" at 1440 px ------

PHONE_PAGES = [CHOOSING, PERFORMANCE, "topics/jit/index.html", COMPARE]
# Every table whose scroll wrapper scrolls sideways, scrolled to its right end: the rows whose
# first cell (the row's label) is not in view at its left edge.
LABELS_IN_VIEW = r"""() => {
  const out = [];
  for (const wrap of document.querySelectorAll('.md-content .md-typeset__scrollwrap')) {
    if (wrap.scrollWidth <= wrap.clientWidth + 1) continue;
    wrap.scrollLeft = wrap.scrollWidth;
    const edge = wrap.getBoundingClientRect().left;
    const hidden = [];
    for (const row of wrap.querySelectorAll('tr')) {
      const cell = row.firstElementChild;
      if (!cell) continue;
      cell.scrollIntoView({block: 'center', inline: 'nearest'});
      wrap.scrollLeft = wrap.scrollWidth;
      const box = cell.getBoundingClientRect();
      const hit = document.elementFromPoint(box.left + Math.min(8, box.width / 2),
                                            box.top + box.height / 2);
      if (box.left < edge - 1 || !(hit && cell.contains(hit)))
        hidden.push(cell.textContent.trim().slice(0, 30));
    }
    out.push({width: wrap.scrollWidth, shown: wrap.clientWidth, hidden});
  }
  return out;
}"""


def test_wide_tables_keep_their_row_labels_on_a_phone(browser, base_url):
    """At 390 x 844 px, on the choosing, performance, jit and compare pages, a table that scrolls
    sideways keeps every row's label (its first cell) in view when scrolled to its right end."""
    problems: list[str] = []
    page = new_page(browser, base_url, PHONE, problems)
    failures, scrolled = [], 0
    for name in PHONE_PAGES:
        if name not in PAGES:
            continue
        page.goto(base_url + url_path(name))
        for table in page.evaluate(LABELS_IN_VIEW):
            scrolled += 1
            if table["hidden"]:
                failures.append(f"{name}: {table['width']} px in {table['shown']}: {table}")
        (SHOTS / "reading").mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SHOTS / "reading" / f"{slug(name)}-tables-{PHONE}.png")
    page.close()
    assert scrolled, "no table scrolls sideways on a phone: nothing was checked"
    assert not failures, "\n".join(failures)
    assert not problems, problems


# Every copy button that shows, scrolled to the middle of the window: whether a tap at its
# centre reaches it (nothing, such as a code block's title kept in view, lies over it).
TAPPABLE = r"""() => {
  const covered = [];
  const buttons = [...document.querySelectorAll('.md-content [data-md-type="copy"]')]
    .filter(b => b.offsetHeight > 0);
  for (const button of buttons) {
    button.scrollIntoView({block: 'center'});
    const box = button.getBoundingClientRect();
    const hit = document.elementFromPoint(box.left + box.width / 2, box.top + box.height / 2);
    if (!(hit && (hit === button || button.contains(hit))))
      covered.push(`${button.closest('.highlight').querySelector('.filename')?.textContent
        || '?'} under ${hit ? hit.className || hit.tagName : 'nothing'}`);
  }
  return {count: buttons.length, covered};
}"""


@pytest.mark.parametrize("width", READING)
def test_every_copy_button_takes_the_tap(browser, base_url, width):
    """On the compare page (pure JAX against Keras 3) and the topic pages, every copy button
    that shows is the element a tap at its centre reaches."""
    problems: list[str] = []
    page = new_page(browser, base_url, width, problems)
    failures, seen = [], 0
    for name in [f"{url_path(COMPARE)}?a=pure_jax&b=keras", *map(url_path, TOPICS)]:
        page.goto(base_url + name)
        if page.locator("pre").count():
            page.wait_for_selector('[data-md-type="copy"]', state="attached", timeout=2000)
        found = page.evaluate(TAPPABLE)
        seen += found["count"]
        if found["covered"]:
            failures.append(
                f"{name}: {len(found['covered'])} of {found['count']}: {found['covered'][:3]}"
            )
    page.close()
    assert seen, "no copy button found"
    assert not failures, "\n".join(failures)
    assert not problems, problems


def test_an_unknown_name_in_the_compare_address_is_said_so(browser, base_url):
    problems: list[str] = []
    page = new_page(browser, base_url, WIDE, problems)
    page.goto(base_url + url_path(COMPARE) + "?a=pure_jax&b=torch")
    note = page.locator(".rosetta-unknown")
    assert note.count() == 1
    text = note.text_content()
    assert '"torch"' in text and "pure_jax" in text, text
    page.goto(base_url + url_path(COMPARE) + "?a=pure_jax&b=keras")
    assert page.locator(".rosetta-unknown").count() == 0
    page.close()
    assert not problems, problems


# In the view of all six at 1440 px: every line whose text reaches past the edge of its code
# block (clipped, or scrolled out of sight), and every string token drawn on more than one row
# that holds no space, split elsewhere than at the breaks rosetta.js allows (<wbr>: after a
# bracket, a comma, "=" or "/", before a dot), as "dm-" and "haiku" would be.
ALL_SIX_FITS = r"""() => {
  const wide = [], split = [];
  const range = document.createRange();
  for (const pre of document.querySelectorAll('.rosetta .tabbed-block pre')) {
    if (!pre.offsetHeight) continue;
    const edge = pre.querySelector('code').getBoundingClientRect().right;  // where code is cut
    for (const line of pre.querySelectorAll('code > span[id^="__span"]')) {
      const walker = document.createTreeWalker(line, NodeFilter.SHOW_TEXT);
      let right = 0;
      for (let n = walker.nextNode(); n; n = walker.nextNode()) {
        const text = n.data.replace(/\s+$/, '');  // a space a line breaks at may hang past
        if (!text) continue;
        range.setStart(n, 0);
        range.setEnd(n, text.length);
        right = Math.max(right, ...[...range.getClientRects()].map(r => r.right));
      }
      if (right > edge + 0.5)
        wide.push(`${(right - edge).toFixed(1)} px: ${line.textContent.trim().slice(0, 50)}`);
    }
    for (const token of pre.querySelectorAll('code span[class^="s"]')) {
      if (/\s/.test(token.textContent)) continue;
      const walker = document.createTreeWalker(token, NodeFilter.SHOW_TEXT);
      for (let n = walker.nextNode(); n; n = walker.nextNode()) {  // the runs between <wbr>s
        range.selectNodeContents(n);
        const rows = new Set([...range.getClientRects()].filter(r => r.width > 0)
          .map(r => Math.round(r.top))).size;
        if (rows > 1) split.push(n.data);
      }
    }
  }
  return {wide, split};
}"""


def test_all_six_fit_their_columns_at_1440(visits):
    """With every implementation shown (six columns at 1440 x 900 px), on every topic page no
    code block is wider than its column and no string without a space is split across rows."""
    failures, problems = [], []
    for name in TOPICS:
        measured = visits(WIDE, "all", name)
        problems += measured["problems"]
        found = measured["all_six"]
        if found["wide"] or found["split"]:
            failures.append(
                f"{name}: {len(found['wide'])} wide: {found['wide'][:3]}; "
                f"split: {found['split'][:3]}"
            )
    assert not failures, "\n".join(failures)
    assert not problems, problems
