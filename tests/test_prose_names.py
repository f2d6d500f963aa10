"""The framework names the pages put in code font are names the implementations use.

Three kinds of sentences describe the implementation files in words: the compare page's contrast
lines (``docs/data/contrasts.toml``, a phrase per style and section), the topic pages' differences
blocks (a bullet per style, per section of the files) and the "mind" cell of each row of the
choosing page's decision table (``NEEDS`` of ``docs_build/decision.py``). Every dotted name in code
font there that starts with a framework (``jax``, ``flax``, ``haiku``, ``equinox``, ``keras``,
``optax``, ``jmp``, or the name a file imports one as: ``nnx``, ``hk``, ``eqx``, ...) must be a
name the implementation it describes uses in its code (its imports resolved), or one the shared
code that runs every implementation uses (``shared/spec``, the trainer): a call renamed in the code
and not in the words fails here. A decision row's advice may also name an API of the framework the
implementation does not call (a way to migrate, say): that name must exist in the installed
framework. Runs where every framework is installed (tox: ``cross``).
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cross

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs_build"))

from compare_page import OPENING, contrasts  # noqa: E402  (the modules of docs_build/)
from decision import NEEDS  # noqa: E402
from differences import section_differences  # noqa: E402
from repository import IMPLEMENTATIONS, SECTIONS  # noqa: E402

FRAMEWORKS = {"jax", "flax", "haiku", "equinox", "keras", "optax", "jmp"}
# the shared code every implementation runs through: the spec's helpers and the trainer
SHARED = [*sorted((ROOT / "shared" / "spec").glob("*.py")), ROOT / "shared" / "app" / "trainer.py"]
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


@functools.cache
def used(path: Path) -> tuple[frozenset[str], dict[str, str]]:
    """The dotted names a file's code uses (``nnx.state``, ``train_state.TrainState``), each also
    with its first name resolved through the file's imports (``flax.nnx.state``), and those
    imports (``{"nnx": "flax.nnx"}``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imports: dict[str, str] = {}
    chains: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                imports[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Attribute):
            parts = []
            while isinstance(node, ast.Attribute):
                parts.append(node.attr)
                node = node.value
            if isinstance(node, ast.Name):
                chains.add(".".join([node.id, *reversed(parts)]))
    names = set(imports.values())
    for chain in chains:
        head, _, rest = chain.partition(".")
        names.add(chain)
        if head in imports:
            names.add(f"{imports[head]}.{rest}")
    return frozenset(names), imports


def resolved(name: str, imports: dict[str, str]) -> str | None:
    """``name`` with its first part resolved through ``imports``; None if it does not start with
    a framework."""
    head, _, rest = name.partition(".")
    full = f"{imports[head]}.{rest}" if head in imports else name
    return full if full.split(".")[0] in FRAMEWORKS else None


def framework_names(text: str) -> list[str]:
    return [s.removesuffix("()") for s in re.findall(r"`([^`]+)`", text)
            if DOTTED.fullmatch(s.removesuffix("()"))]  # fmt: skip


def unused(impl: str, text: str) -> list[str]:
    """The framework names in code font in ``text`` that neither ``impl``'s file nor the shared
    code uses."""
    names, imports = used(ROOT / IMPLEMENTATIONS[impl][1])
    shared = set().union(*(used(path)[0] for path in SHARED))
    missing = []
    for name in framework_names(text):
        full = resolved(name, imports)
        if full is not None and not {name, full} & (names | shared):
            missing.append(name)
    return missing


def exists(name: str) -> bool:
    """Whether the dotted ``name`` is a module or an attribute of one, as installed here."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            if not hasattr(found, part):
                return False
            found = getattr(found, part)
        return True
    return False


def test_the_compare_page_s_phrases_name_what_the_code_uses():
    table = contrasts()
    wrong = {
        (section, impl): missing
        for section in (OPENING, *SECTIONS)
        for impl in IMPLEMENTATIONS
        if (missing := unused(impl, table[section][impl]))
    }
    assert not wrong, (
        f"docs/data/contrasts.toml names what the implementation does not use: {wrong}"
    )


def test_the_topic_pages_differences_name_what_the_code_uses():
    wrong = {
        (page, section, impl): missing
        for section, (page, bullets) in section_differences().items()
        for impls, text in bullets
        for impl in impls
        if (missing := unused(impl, text))
    }
    assert not wrong, f"a differences block names what the implementation does not use: {wrong}"


def test_the_decision_table_s_advice_names_what_exists():
    wrong = {}
    for need, impl, *_, mind in NEEDS:
        if impl is None:
            continue
        imports = used(ROOT / IMPLEMENTATIONS[impl][1])[1]
        missing = [n for n in unused(impl, mind) if not exists(resolved(n, imports))]
        if missing:
            wrong[need] = missing
    assert not wrong, (
        f"a decision row's advice names what neither the code nor the framework has: {wrong}"
    )


@pytest.mark.parametrize(
    ("impl", "text", "expected"),
    [
        ("haiku", "the pure functions `hk.transform` makes", ["hk.transform"]),
        ("haiku", "the pure functions `hk.multi_transform` makes", []),
        ("flax_nnx", "one `nnx.split`, and `nnx.merge` inside the step", ["nnx.split"]),
        ("flax_linen", "`flax.linen` for the model, `train_state.TrainState`", []),
        ("keras", "runs under a plain `jax.jit`", []),  # the trainer jits every fast path
        ("pure_jax", "`model.fit` and `stateless_call` are not framework names here", []),
    ],
)
def test_a_renamed_call_is_caught(impl, text, expected):
    assert unused(impl, text) == expected
