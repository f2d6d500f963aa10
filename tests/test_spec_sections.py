"""Every reference to a numbered section of the spec names a section ``docs/spec.md`` has.

Code, docstrings, templates and pages cite the spec as "SPEC section 5", "SPEC sections 1, 4 and
5", "SPEC sections 1 to 3", "SPEC 4, 5" (in tables) or "the spec's section 3". Each number must be
a numbered section of the page an outsider has (``## 5. Optimiser``), so a reader can follow every
one.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "docs" / "spec.md"

# "SPEC section 5", "SPEC sections 1, 4 and 5", "SPEC sections 1 to 3", "SPEC 4, 5", "SPEC 7 and"
NUMBERS = r"\d+(?:(?:, | and | to |, and )\d+)*"
REFERENCE = re.compile(rf"\bSPEC (?:sections? )?({NUMBERS})|\bthe spec's sections? ({NUMBERS})")
HEADING = re.compile(r"^## (\d+)\. (.+)$", re.MULTILINE)


def spec_sections() -> dict[int, str]:
    return {int(number): title for number, title in HEADING.findall(SPEC.read_text())}


def numbers(text: str) -> set[int]:
    """The sections a reference's numbers name, a range ``1 to 3`` as every number in it."""
    found: set[int] = set()
    for part in re.split(r", and |, | and ", text):
        low, _, high = part.partition(" to ")
        found.update(range(int(low), int(high or low) + 1))
    return found


def references() -> list[tuple[str, int, str, set[int]]]:
    """``(file, line, reference, numbers)`` for every reference in a tracked text file."""
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    found = []
    for name in listed:
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".toml", ".ini", ".txt", ".cfg"} or not path.is_file():
            continue
        if path == Path(__file__).resolve():  # its examples name sections on purpose
            continue
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in REFERENCE.finditer(line):
                text = match.group(1) or match.group(2)
                found.append((name, lineno, match.group(0), numbers(text)))
    return found


def test_the_spec_page_numbers_its_sections_one_after_another():
    sections = spec_sections()
    assert sorted(sections) == list(range(1, len(sections) + 1)), sections
    assert len(sections) >= 7, f"docs/spec.md has too few numbered sections: {sections}"


def test_every_reference_names_a_section_of_the_spec_page():
    sections = spec_sections()
    found = references()
    assert len(found) > 50, f"only {len(found)} references found: the pattern no longer matches"
    missing = [
        f"{name}:{lineno}: {text!r} (no section {sorted(n - sections.keys())})"
        for name, lineno, text, n in found
        if not n <= sections.keys()
    ]
    assert not missing, "references to sections docs/spec.md does not have:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("SPEC section 5", {5}),
        ("SPEC sections 1, 4 and 5", {1, 4, 5}),
        ("SPEC sections 1 to 3", {1, 2, 3}),
        ("SPEC 4, 5", {4, 5}),
        ("the spec's section 12", {12}),
    ],
)
def test_a_reference_is_read_as_the_sections_it_names(text, expected):
    match = REFERENCE.search(text)
    assert match is not None
    assert numbers(match.group(1) or match.group(2)) == expected


def test_a_reference_to_a_missing_section_is_found(tmp_path):
    """The check has teeth: a section number past the page's last is reported."""
    last = max(spec_sections())
    match = REFERENCE.search(f"see SPEC section {last + 1}")
    assert match is not None and not numbers(match.group(1)) <= spec_sections().keys()
