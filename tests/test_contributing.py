"""``CONTRIBUTING.md`` against the repository: every file it names exists, each recipe names the
test that guards it, and the built-in recipe names the one list of built-in implementations
(``pyproject.toml``'s entry points, and ``tox.ini``'s environment for each), which no other file of
the project's code repeats: everything else reads each implementation's ``ABOUT``. And the recipe
is the whole truth: every file that names all the built-ins (by name or by label) is one it names,
by hand or generated, and each generated one with the command that regenerates it."""

from __future__ import annotations

import ast
import fnmatch
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEXT = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
BUILTINS = list(PYPROJECT["project"]["entry-points"]["cvae_rosetta.impls"])
LISTS = {"pyproject.toml", "tox.ini"}  # the entry points and extras; an environment for each
PATH = re.compile(r"`((?:[\w.-]+/)*[\w.-]+\.(?:py|md|toml|ini|yml|json))`")
PLACE = re.compile(r"`((?:[\w.*-]+/)*[\w.*-]+\.(?:py|md|toml|ini|yml|json))`")  # globs too
COMMAND = re.compile(r"`(?:python|cvae|pytest|tox)\b[^`]*`")


def recipes() -> dict[str, str]:
    parts = re.split(r"^### (.+)$", TEXT.split("## Recipes", 1)[1], flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode == 0 and out.stdout:
        return out.stdout.split()
    # not a git checkout (an unpacked source tree): every file under the root
    return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()]


def test_every_file_named_exists():
    # NAME, LAYER: a placeholder a recipe asks to fill in
    named = [p for p in PATH.findall(TEXT) if not re.search(r"[A-Z]{4,}", p) and "*" not in p]
    assert len(named) > 20
    missing = [p for p in named if "/" in p and not (ROOT / p).exists()]
    missing += [p for p in named if "/" not in p and not (ROOT / p).exists() and "." in p]
    assert missing == []


def test_every_recipe_names_the_tests_that_guard_it():
    found = recipes()
    assert len(found) == 7, list(found)
    for name, body in found.items():
        guard = body[body.index("Guarded by:") :]
        assert re.search(r"tests/test_\w+\.py|tox -e \w+", guard), name
        for path in PATH.findall(guard):
            assert (ROOT / path).exists(), (name, path)


def lists_every_builtin(name: str, text: str) -> bool:
    """Whether a file lists every built-in: in Python, one literal (a tuple, list or set of
    strings, a dict's keys, a string) that holds every name; in any other file, the text."""
    if not name.endswith(".py"):
        return all(b in text for b in BUILTINS)
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [key for key in node.keys if key is not None]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if all(b in node.value for b in BUILTINS):
                return True
            continue
        else:
            continue
        strings = {i.value for i in items if isinstance(i, ast.Constant)}
        if set(BUILTINS) <= strings:
            return True
    return False


def test_the_built_ins_are_listed_once_and_the_recipe_says_where():
    """The recipe names the files that list the built-ins, and they are the only ones: the
    project's code (tests, examples and docs prose aside) reads the entry points instead."""
    assert len(BUILTINS) >= 5
    body = recipes()["A built-in implementation"]
    lists = body[body.index("The one list") : body.index("Its docs text")]
    assert set(PATH.findall(lists)) == LISTS
    found = set()
    for name in tracked():
        if name.startswith(("tests/", "examples/", "benchmarks/results/", "docs/data/")):
            continue
        path = ROOT / name
        if name.endswith((".md", ".png", ".json")) or not path.is_file():
            continue
        if lists_every_builtin(name, path.read_text(encoding="utf-8", errors="replace")):
            found.add(name)
    assert found == LISTS


def test_the_guard_sees_a_list_in_every_form():
    names = ", ".join(map(repr, BUILTINS))
    spaced = " ".join(BUILTINS)
    for source in (f"X = ({names})", f"X = [{names}]", f"X = {{{names}}}", f"X = {spaced!r}"):
        assert lists_every_builtin("x.py", source), source
    keys = ", ".join(f"{n!r}: 1" for n in BUILTINS)
    assert lists_every_builtin("x.py", f"X = {{{keys}}}")
    assert lists_every_builtin("x.sh", " ".join(BUILTINS))
    rows = "\n".join(f"R{i} = ({n!r}, 'a need')" for i, n in enumerate(BUILTINS))
    assert not lists_every_builtin("x.py", rows)  # a table of rows, each naming one


def labels() -> list[str]:
    """Each built-in's ``ABOUT["label"]``, read from its file as the project reads it."""
    from cvae_rosetta.spec import protocol

    return [info.about.label for info in protocol.known() if info.builtin]


def names_every_builtin(text: str, keys: list[str], names: list[str]) -> bool:
    """Whether ``text`` names every built-in: by its key (``flax_nnx``) or by its label."""
    assert keys and names
    return all(key in text for key in keys) or all(name in text for name in names)


def test_the_recipe_names_every_file_that_names_the_built_ins():
    """A seventh built-in changes every file that names all six: each is named by the recipe (a
    path, or a glob such as ``docs/topics/*.md``). The project's tests and this guide aside."""
    names = labels()
    assert len(names) == len(BUILTINS)
    body = recipes()["A built-in implementation"]
    named = set(PLACE.findall(body))
    places = []
    for name in tracked():
        path = ROOT / name
        if name.startswith("tests/") or name == "CONTRIBUTING.md" or not path.is_file():
            continue
        if path.suffix in (".png", ".gz", ".ico", ".woff2"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if names_every_builtin(text, BUILTINS, names):
            places.append(name)
    assert len(places) > 20, places  # the docs pages, the tour, the results, the lists
    unnamed = [p for p in places if not any(fnmatch.fnmatch(p, glob) for glob in named)]
    assert unnamed == []


def test_each_generated_file_is_named_with_the_command_that_regenerates_it():
    body = recipes()["A built-in implementation"]
    generated = body[body.index("Generated,") : body.index("Guarded by:")]
    bullets = re.split(r"^  - ", generated, flags=re.MULTILINE)[1:]
    results = {p for p in tracked() if p.startswith("benchmarks/results/") and p.endswith(".json")}
    names = labels()
    enumerating = {
        p for p in results if names_every_builtin((ROOT / p).read_text(), BUILTINS, names)
    }
    assert enumerating, results
    for bullet in bullets:
        assert COMMAND.search(bullet), bullet
    covered = {p for bullet in bullets for p in PLACE.findall(bullet.split(":", 1)[0])}
    assert enumerating <= covered, enumerating - covered


def test_the_guard_finds_the_built_ins_by_name_or_by_label():
    keys, names = ["a_b", "c"], ["A B", "C"]
    assert names_every_builtin("a_b and c", keys, names)
    assert names_every_builtin("A B beside C", keys, names)
    assert not names_every_builtin("a_b beside C", keys, names)


# --- the map of the modules ----------------------------------------------------------------------

MAPPED = ("shared", "impls", "conformance", "docs_build", "benchmarks", "template")
MAP_ENTRY = re.compile(r"^- `([\w/]+\.py)`: (\S.*)$")


def module_map(text: str) -> list[str]:
    """The modules the map of CONTRIBUTING.md lists, in its order; a bullet of the map that is not
    one module and its idea on one line fails."""
    section = text.split("\n## Map of the modules\n", 1)[1].split("\n## ", 1)[0]
    listed = []
    for line in section.splitlines():
        if line.startswith("- "):
            entry = MAP_ENTRY.match(line)
            assert entry, f"CONTRIBUTING.md, the map: expected - `PATH.py`: its idea, got {line!r}"
            listed.append(entry.group(1))
    return listed


def map_mismatch(listed: list[str], tree: set[str]) -> list[str]:
    """What the map and the tree disagree on, each in a line."""
    twice = sorted({m for m in listed if listed.count(m) > 1})
    return [
        *(f"{m}: a module the map does not list" for m in sorted(tree - set(listed))),
        *(f"{m}: listed in the map, no such module" for m in sorted(set(listed) - tree)),
        *(f"{m}: listed more than once" for m in twice),
    ]


def test_the_map_lists_every_module_once_and_nothing_else():
    tree = {
        str(path.relative_to(ROOT))
        for folder in MAPPED
        for path in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert len(tree) > 100
    assert map_mismatch(module_map(TEXT), tree) == []


def test_the_map_check_names_a_module_missing_a_line_without_module_and_a_repeat():
    text = "# C\n\n## Map of the modules\n\n- `a/x.py`: one idea.\n- `a/y.py`: another.\n"
    text += "- `a/y.py`: again.\n\n## Recipes\n\n- `a/z.py`: not the map.\n"
    assert map_mismatch(module_map(text), {"a/x.py", "a/w.py"}) == [
        "a/w.py: a module the map does not list",
        "a/y.py: listed in the map, no such module",
        "a/y.py: listed more than once",
    ]
    with pytest.raises(AssertionError, match="a/x.py"):
        module_map("\n## Map of the modules\n\n- `a/x.py` without its idea\n")
