"""The built docs site in a real browser: headless Chromium, driven over the DevTools Protocol.

Run by ``tox -e docs`` after ``mkdocs build`` (the site is ``$CVAE_DOCS_SITE``, default ``site/``).
The site is served from 127.0.0.1 by Python's ``http.server`` in a thread; Playwright drives the
system's Chromium (``$CVAE_CHROMIUM``, else ``chromium`` on the PATH: Debian's package), so nothing
downloads a browser. Without Chromium, Playwright or a built site, every test here is skipped and
the reason says which. Screenshots go to ``$CVAE_DOCS_SCREENSHOTS`` (default ``site-screenshots/``,
ignored by git): the first screenful of every page at 1440 px, every side-by-side page whole at
1440 and 800 px, and the views of two implementations (``pair/``) with their measurements
(``pair/measurements.json``: the widest code line against its column, for every pair), and the
choosing and performance pages whole at 1440 x 900 px with their tables' measurements
(``layout/``: the page's height, the text column's width, every table's top, width and sideways
scroll).
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import itertools
import json
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
# The implementations (key: (label, file)) and their sections, as the docs build knows them.
_spec = importlib.util.spec_from_file_location("cvae_docs_hooks", ROOT / "docs_build" / "hooks.py")
hooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hooks)  # it reads files only: no MkDocs needed
IMPLEMENTATIONS, SECTIONS = hooks.IMPLEMENTATIONS, hooks.SECTIONS
LABELS = [label for label, _ in IMPLEMENTATIONS.values()]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WIDE, NARROW = 1440, 800  # where a pair fits 100-character lines; where the columns are tabs


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


def new_page(browser, base_url: str, width: int, problems: list[str], **options):
    """A tab of ``width`` x 900 px, in a context of its own (nothing stored from another test),
    that records console errors, uncaught exceptions, failed and refused requests and HTTP errors
    into ``problems``; requests off the site are aborted. ``options`` go to Playwright's
    ``new_page`` (``java_script_enabled=False``, say)."""
    page = browser.new_page(viewport={"width": width, "height": 900}, **options)

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
    """Every page loaded once at 1440 px: its problems, the links on it, the ids in it (waiting
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
    the second beside it (or below), the same width, top-aligned side by side; no code line
    wraps, and side by side every line fits in its column (nothing to scroll)."""
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
                assert code["whiteSpace"] == "pre", (where, code["whiteSpace"])
                assert not code["wrapped"], (where, "wrapped", code["wrapped"][:3])
                if columns:
                    assert code["overflow"] <= 0, (where, "a line wider than its column", code)


@pytest.mark.parametrize("width", [WIDE, NARROW])
def test_side_by_side_pages_fit_the_screen(browser, base_url, width):
    """All as columns at 1440 px, as tabs at 800 px; nothing wider than the window at either,
    and at 1440 px no code line broken inside a name or any other token."""
    (SHOTS / str(width)).mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    page = new_page(browser, base_url, width, problems)
    failures = []
    for name in SIDE_BY_SIDE:
        page.goto(base_url + url_path(name))
        layout = page.evaluate(LAYOUT)
        split = page.evaluate(SPLIT_TOKENS) if width == WIDE else []
        page.screenshot(path=SHOTS / str(width) / f"{slug(name)}.png", full_page=True)
        try:
            assert layout["pageOverflow"] <= 0, f"{name}: page {layout['pageOverflow']} px too wide"
            assert not split, f"{name}: broken inside a token: {split[:3]}"
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


def test_the_compare_page_shows_every_pair_chosen_by_the_controls(browser, base_url):
    """Every ordered pair of them, chosen with the controls on the compare page at 1440 px:
    the two files' openings and sections, each beside the same one of the other, aligned and
    unwrapped; the address names the pair, and opening it elsewhere shows the same view."""
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
    """On a topic page: all of them at first; "Two" and the two lists choose a pair, which every
    topic and tour page then shows (and its address names), and which the link to the whole
    files carries to the compare page; "All six" brings the columns back, on every page."""
    shots = SHOTS / "pair"
    shots.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    page = new_page(browser, base_url, WIDE, problems)
    first = SIDE_BY_SIDE[0]
    page.goto(base_url + url_path(first))
    assert page.is_checked(".rosetta-view input[value=all]")
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
    page.get_by_label(f"All {hooks.NUMBER_WORDS[len(LABELS)]}").check()
    assert page.evaluate("location.search") == ""
    for name in (first, SIDE_BY_SIDE[-1]):
        page.goto(base_url + url_path(name))
        check_columns(page.evaluate(LAYOUT), name)
    page.close()
    assert not problems, problems


def test_a_pair_stacks_on_a_narrow_screen(browser, base_url):
    """At 800 px the two stand one above the other, each as wide as the page; the code scrolls
    sideways rather than wrap."""
    shots = SHOTS / "pair"
    shots.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    page = new_page(browser, base_url, NARROW, problems)
    for name in (COMPARE, SIDE_BY_SIDE[0]):
        page.goto(base_url + url_path(name) + "?a=equinox&b=flax_linen")
        check_pair(page.evaluate(LAYOUT), ("equinox", "flax_linen"), name, columns=False)
        page.screenshot(path=shots / f"{slug(name)}-{NARROW}.png")
    page.close()
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
