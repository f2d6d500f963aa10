"""The lines-of-code tables (``<!-- generated: loc-table -->``, ``tour-loc-table``): the code
lines of each marked section, without blank lines, comments and docstrings, counted by role so
that the styles compare like with like."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from repository import BUILTIN, IMPLEMENTATIONS, ROOT, TOUR
from sections import sections_of

from cvae_rosetta.app.markdown import markdown_table


def code_lines(source: str) -> set[int]:
    """Line numbers holding code: no blank lines, no comment-only lines, no docstrings."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    ignored = {
        tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
        tokenize.ENCODING, tokenize.ENDMARKER,
    }  # fmt: skip
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in ignored:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines - docstrings


def section_counts(path: Path) -> dict[str, int]:
    """Code lines per marked section, and ``"file"`` for the whole file."""
    source = path.read_text(encoding="utf-8")
    code = code_lines(source)
    counts = {
        name: len({n for n in code if s < n < e}) for name, (s, e) in sections_of(path).items()
    }
    counts["file"] = len(code)
    return counts


SHARED_STATE = ROOT / "shared" / "spec" / "state.py"  # the TrainState pure JAX and Haiku use
# What each style's file is counted as, like with like: the model and its training (what a project
# of its own writes in that style), its state (the `init` section, without the converters to and
# from the spec's canonical tree; with the shared TrainState where the file uses it), and what
# this project's protocol adds (the converters, the fast path, the other paths, the adapter).
ROLES = (
    ("the model: `module`, `forward`", ("module", "forward")),
    ("its loss and step: `loss`, `train_step`", ("loss", "train_step")),
    ("its parameters and state: `init` without the converters", ("init",)),
    ("for the protocol: the converters, `fast_path`, `paths`, `adapter`", ("fast_path", "paths",
                                                                          "adapter")),
)  # fmt: skip


def converter_lines(path: Path) -> set[int]:
    """The code lines of the file's top-level functions whose name says they convert to or from
    the canonical tree (``to_canonical``, ``from_canonical_params``, ...)."""
    source = path.read_text(encoding="utf-8")
    code = code_lines(source)
    spans = [
        range(min([node.lineno, *(d.lineno for d in node.decorator_list)]), node.end_lineno + 1)
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and "canonical" in node.name
    ]
    return {n for span in spans for n in span if n in code}


def shared_state_lines(path: Path) -> int:
    """The shared ``TrainState``'s code lines where the file imports it, else 0."""
    uses = re.search(r"^from cvae_rosetta\.spec\.state import .*\bTrainState\b",
                     path.read_text(encoding="utf-8"), re.MULTILINE)  # fmt: skip
    if not uses:
        return 0
    source = SHARED_STATE.read_text(encoding="utf-8")
    code = code_lines(source)
    cls = next(n for n in ast.parse(source).body if getattr(n, "name", None) == "TrainState")
    return len({n for n in code if cls.lineno <= n <= cls.end_lineno})


def role_counts(path: Path) -> list[tuple[int, int]]:
    """Per role of :data:`ROLES`: ``(own lines, shared lines)``."""
    counts, sections = section_counts(path), sections_of(path)
    converters = converter_lines(path)
    start, end = sections.get("init", (0, 0))
    in_init = len({n for n in converters if start < n < end})
    out = []
    for _, names in ROLES:
        own = sum(counts.get(name, 0) for name in names)
        if "init" in names:
            out.append((own - in_init, shared_state_lines(path)))
        elif "adapter" in names:
            out.append((own + len(converters), 0))
        else:
            out.append((own, 0))
    return out


def loc_table() -> str:
    paths = {key: ROOT / source for key, (_, source) in IMPLEMENTATIONS.items()}
    roles = {key: role_counts(path) for key, path in paths.items()}
    counts = {key: section_counts(path) for key, path in paths.items()}

    def cell(own: int, shared: int) -> str:
        return f"{own} + {shared} shared" if shared else str(own)

    header = ["", *(label for label, _ in IMPLEMENTATIONS.values())]
    rows = [[role, *(cell(*roles[k][i]) for k in roles)] for i, (role, _) in enumerate(ROLES)]
    total = [(sum(o for o, _ in roles[k]), sum(s for _, s in roles[k])) for k in roles]
    rows.append(["**all**", *(f"**{cell(*t)}**" for t in total)])
    rows.append(["whole file (imports included)", *(counts[k]["file"] for k in counts)])
    return markdown_table(header, rows, "l" + "r" * len(IMPLEMENTATIONS))


def tour_loc_table() -> str:
    """Code lines of each tour example per implementation: its section named after the
    implementation's key. A column for every built-in, and for one registered from outside that
    some example has a section for."""
    counts = {name: section_counts(ROOT / "examples" / "tour" / f"{name}.py") for name in TOUR}
    keys = [k for k in IMPLEMENTATIONS if k in BUILTIN or any(k in c for c in counts.values())]
    header = ["tour example", *(IMPLEMENTATIONS[key][0] for key in keys)]
    rows = [
        [f"[{name}](tour/{name}.md)", *(counts[name].get(key, 0) for key in keys)] for name in TOUR
    ]
    return markdown_table(header, rows, "l" + "r" * len(keys))
