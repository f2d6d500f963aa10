"""What differs, framework by framework: the differences blocks of a page, one bullet per
implementation or group of them between ``<!-- differences: SECTION -->`` and
``<!-- end differences -->``, read and checked, and the topic pages' blocks by the section they
name; and the rule that a side-by-side page says what it is about, and a topic page what differs,
before its first code."""

from __future__ import annotations

import re
from collections import Counter

from markdown_text import unfenced
from repository import BUILTIN, DOCS, IMPLEMENTATIONS, SECTIONS, DocsError

DIFFERENCES = re.compile(
    r"^<!-- differences(?::[ \t]*(?P<name>[-\w]+))?[ \t]*-->[ \t]*\n(?P<body>.*?)"
    r"^<!-- end differences -->[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
BULLET_LABELS = re.compile(r"^- (?P<labels>\*\*[^*\n]+\*\*(?:(?:,? and |, )\*\*[^*\n]+\*\*)*)")
TOPICS = DOCS / "topics"
CODE_START = re.compile(r"^(?:<!-- (?:rosetta|snippet)\b|[ \t]*(?:`{3,}|~{3,}))", re.MULTILINE)


def differences(markdown: str) -> list[tuple[str | None, list[tuple[list[str], str]]]]:
    """A page's differences blocks, in order: ``(name, [(keys, text), ...])``, one item per
    bullet, ``keys`` the implementations its bold labels name, ``text`` the bullet without its
    ``- `` and its continuation lines' indentation.

    A block is written::

        <!-- differences: SECTION -->
        - **Pure JAX** has no module: ...
        - **Flax NNX**, **Equinox** and **Keras 3** ...
        <!-- end differences -->

    and must name every built-in implementation exactly once (by its label, any case); a block
    named after a section of the implementation files is what the compare page shows under that
    section for the two implementations chosen."""
    by_label = {label.lower(): key for key, (label, _) in IMPLEMENTATIONS.items()}
    blocks = []
    for m in DIFFERENCES.finditer(unfenced(markdown)):
        name = m["name"]
        if name is not None and name not in SECTIONS:
            raise DocsError(
                f"differences block {name!r}: expected a section of the implementation files "
                f"({', '.join(SECTIONS)}) or no name"
            )
        items: list[tuple[list[str], list[str]]] = []
        for line in m["body"].splitlines():
            if not line.strip():
                continue
            if line.startswith("- "):
                lead = BULLET_LABELS.match(line)
                labels = re.findall(r"\*\*([^*]+)\*\*", lead["labels"]) if lead else []
                unknown = [label for label in labels if label.lower() not in by_label]
                if not labels or unknown:
                    raise DocsError(
                        f"differences block {name or '(unnamed)'}: expected each bullet to start "
                        f"with bold labels ({', '.join(lab for lab, _ in IMPLEMENTATIONS.values())}"
                        f"), got {line[:60]!r}"
                    )
                items.append(([by_label[label.lower()] for label in labels], [line[2:]]))
            elif line.startswith((" ", "\t")) and items:
                items[-1][1].append(line.strip())
            else:
                raise DocsError(
                    f"differences block {name or '(unnamed)'}: expected bullets ('- **Label** "
                    f"...') and their indented continuation lines, got {line[:60]!r}"
                )
        named = Counter(key for keys, _ in items for key in keys)
        missing = [IMPLEMENTATIONS[k][0] for k in IMPLEMENTATIONS if k in BUILTIN and not named[k]]
        twice = [IMPLEMENTATIONS[k][0] for k, n in named.items() if n > 1]
        if missing or twice:
            raise DocsError(
                f"differences block {name or '(unnamed)'}: expected every implementation in "
                f"exactly one bullet, got {'no ' + ', '.join(missing) if missing else ''}"
                f"{'; ' if missing and twice else ''}"
                f"{', '.join(twice) + ' more than once' if twice else ''}"
            )
        blocks.append((name, [(keys, " ".join(lines)) for keys, lines in items]))
    return blocks


def check_words_first(markdown: str, where: str) -> None:
    """A side-by-side page (``topics/*.md``, ``tour/*.md``, not their index pages) says what it
    is about in a paragraph before its first code; a topic page also says, framework by
    framework, what differs (a differences block) before it."""
    parts = where.split("/")
    if len(parts) != 2 or parts[0] not in ("topics", "tour") or parts[1] == "index.md":
        return
    body = re.sub(r"\A---\n.*?\n---\n", "", markdown, flags=re.DOTALL)
    first = CODE_START.search(body)
    before = body[: first.start()] if first else body
    prose = [
        line
        for line in re.sub(r"<!--.*?-->", "", before, flags=re.DOTALL).splitlines()
        if line.strip() and not line.startswith(("#", "- ", "  ", "|"))
    ]
    if first and not prose:
        raise DocsError("expected a paragraph before the first code, got code first")
    if first and parts[0] == "topics" and not DIFFERENCES.search(before):
        raise DocsError(
            "expected a differences block (<!-- differences --> ... <!-- end differences -->) "
            "before the first code: what differs, framework by framework"
        )


def section_differences() -> dict[str, tuple[str, list[tuple[list[str], str]]]]:
    """``{section: (topic page, bullets)}``: the named differences blocks of ``docs/topics``;
    every section of the implementation files must be named by exactly one."""
    found: dict[str, tuple[str, list[tuple[list[str], str]]]] = {}
    for path in sorted(TOPICS.glob("*.md")):
        page = path.relative_to(DOCS).as_posix()
        try:
            blocks = differences(path.read_text(encoding="utf-8"))
        except DocsError as error:
            raise DocsError(f"docs/{page}: {error}") from None
        for name, items in blocks:
            if name is None:
                continue
            if name in found:
                raise DocsError(
                    f"differences block {name!r}: expected one, got one in docs/{found[name][0]} "
                    f"and one in docs/{page}"
                )
            found[name] = (page, items)
    missing = [s for s in SECTIONS if s not in found]
    if missing:
        raise DocsError(
            f"no differences block names section(s) {', '.join(missing)} (expected one "
            "'<!-- differences: SECTION -->' per section in docs/topics/*.md)"
        )
    return found
