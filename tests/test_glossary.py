"""The glossary (docs/glossary.md): every term has its anchor, every link to the glossary lands on
one, and the choosing page links each term it uses to its entry where the term first occurs.

Terms are the glossary's ``## Term { #anchor }`` headings. An anchor is MkDocs' slug of the term
(lowercase, spaces to ``-``, other characters than word characters and ``-`` dropped), written
explicitly so that a change of slugifier cannot move it. On choosing.md the text read is the
hand-written one: code blocks, code spans, HTML comments (the generated tables' markers), link
targets and the generated decision table between its markers are left out.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
GLOSSARY = DOCS / "glossary.md"
HEADING = re.compile(r"^## (?P<term>.+?)\s*\{\s*#(?P<anchor>[\w-]+)\s*\}\s*$", re.M)
LINK = re.compile(r"\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]*)\)")
GLOSSARY_LINK = re.compile(r"(?<![\w.-])glossary\.md#(?P<anchor>[^)\s\"']*)")
DECISION = re.compile(r"<!-- decision:begin -->.*?<!-- decision:end -->", re.S)
# a generated block's committed copy (docs_build/raw_blocks.py)
GENERATED = re.compile(r"<!-- generated: [-\w]+ -->.*?<!-- /generated -->", re.S)


def slug(text: str) -> str:
    """MkDocs' (Python-Markdown toc's) default slug, for the ASCII text of a term."""
    text = re.sub(r"[^\w\s-]", "", text.encode("ascii", "ignore").decode()).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def terms(text: str | None = None) -> dict[str, str]:
    """``{term: anchor}`` from the glossary's headings."""
    return {m["term"]: m["anchor"] for m in HEADING.finditer(text or GLOSSARY.read_text())}


def term_pattern(term: str) -> re.Pattern:
    """The term as a whole phrase, any case, its words joined by spaces or hyphens, plural too."""
    words = [re.escape(w) for w in term.lower().split()]
    return re.compile(r"(?<![\w-])" + r"[\s-]+".join(words) + r"s?(?![\w-])", re.I)


def blank(match: re.Match) -> str:
    """The match replaced by spaces (newlines kept): positions in the text stay where they were."""
    return re.sub(r"[^\n]", " ", match.group(0))


def prose(markdown: str) -> str:
    """The hand-written text of a page, every other character blanked out."""
    markdown = GENERATED.sub(blank, DECISION.sub(blank, markdown))
    markdown = re.sub(r"^(```|~~~).*?^\1[^\n]*$", blank, markdown, flags=re.S | re.M)
    markdown = re.sub(r"<!--.*?-->", blank, markdown, flags=re.S)
    markdown = re.sub(r"(`+).+?\1", blank, markdown, flags=re.S)
    return LINK.sub(blank_target, markdown)


def blank_target(link: re.Match) -> str:
    """The link, its target blanked (``topics/state.md`` is not the term "state"), its text kept."""
    return link.group(0)[: link.start("target") - link.start()] + " " * len(link["target"]) + ")"


def unlinked_first_uses(markdown: str, glossary: dict[str, str]) -> list[str]:
    """Each glossary term whose first occurrence in ``markdown``'s prose is not the text of a link
    to its entry (``glossary.md#anchor``), with what the page has there."""
    text = prose(markdown)  # the same length as markdown: a position means the same in both
    links = [(m.start("text"), m.end("text"), m["target"]) for m in LINK.finditer(markdown)]
    wrong = []
    for term, anchor in glossary.items():
        first = term_pattern(term).search(text)
        if first is None:
            continue
        around = [t for start, end, t in links if start <= first.start() and first.end() <= end]
        if not any(re.search(rf"(?:^|/)glossary\.md#{re.escape(anchor)}$", t) for t in around):
            line = markdown.count("\n", 0, first.start()) + 1
            wrong.append(f"{term!r} first occurs on line {line} as {first.group(0)!r}, not linked")
    return wrong


def test_every_term_has_its_anchor():
    glossary = GLOSSARY.read_text()
    headings = re.findall(r"^## .*$", glossary, re.M)
    found = terms(glossary)
    assert len(found) == len(headings), [h for h in headings if not HEADING.match(h)]
    assert len(found) >= 17, sorted(found)
    for term, anchor in found.items():
        assert anchor == slug(term), f"{term!r}: anchor {anchor!r}, its slug is {slug(term)!r}"
    assert len(set(found.values())) == len(found)
    for needed in (
        "fast-path",
        "idiomatic-path",
        "protocol",
        "adapter",
        "canonical-parameters",
        "state",
        "device-time",
        "per-call",
        "empty-step",
        "step-scan",
        "thunk",
        "roof",
        "within-noise",
        "interval",
        "check",
        "case",
        "section",
    ):
        assert needed in found.values(), needed


def test_every_link_to_the_glossary_lands_on_an_entry():
    anchors = set(terms().values())
    pages = sorted(DOCS.rglob("*.md"))
    seen = 0
    for page in pages:
        for match in GLOSSARY_LINK.finditer(page.read_text()):
            seen += 1
            assert match["anchor"] in anchors, f"{page.relative_to(DOCS)}: #{match['anchor']}"
    assert seen, "no page links to the glossary"
    for match in re.finditer(r"\]\(#(?P<anchor>[^)\s]*)\)", GLOSSARY.read_text()):
        assert match["anchor"] in anchors, f"glossary.md: #{match['anchor']}"


def test_choosing_links_each_term_where_it_first_occurs():
    assert unlinked_first_uses((DOCS / "choosing.md").read_text(), terms()) == []


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        ("The fast path is fast; [fast path](glossary.md#fast-path).", ["'Fast path'"]),
        ("The [fast path](glossary.md#fast-path) is; the fast path.", []),
        ("`fast path` in code, then [fast paths](glossary.md#fast-path).", []),
        ("Over [the state](topics/state.md), later a [state](glossary.md#state).", ["'State'"]),
        ("A [fast path](glossary.md#state) with the wrong anchor.", ["'Fast path'"]),
        (
            "<!-- decision:begin -->\nthe fast path\n<!-- decision:end -->\n"
            "then the [fast path](glossary.md#fast-path).",
            [],
        ),
        ("Linked [checks](glossary.md#check), never checked again.", []),
    ],
)
def test_the_first_use_check_reads_pages_as_meant(page, expected):
    glossary = {"Fast path": "fast-path", "State": "state", "Check": "check"}
    found = unlinked_first_uses(page, glossary)
    assert [w.split(" first")[0] for w in found] == expected, found
