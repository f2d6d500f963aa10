"""The choosing page's evidence beyond speed, each from its own record: what a change costs in
each style (``benchmarks/change_cost.py``), how long each implementation file keeps working on
its framework's releases (``benchmarks/version_matrix.py``), and what there is to learn in it
(``benchmarks/concepts.py``). For each, the table the page shows and the style a decision row
chooses by it, with the sentence that says why; a style whose maintainers tell new projects to
use another (:data:`EXISTING_CODE_ONLY`) is never chosen.
"""

from __future__ import annotations

import datetime
from collections import Counter
from typing import Any

from cvae_rosetta.app.markdown import markdown_table
from cvae_rosetta.bench.markdown import impl_label
from cvae_rosetta.spec import registry

# Haiku: its maintainers recommend Flax for new projects (its description on the registry)
EXISTING_CODE_ONLY = ("haiku",)
# Counts written by different hands differ by a few lines for the same idea: styles within a tenth
# of the fewest (lines changed, names to learn) are named together.
TIE = 0.10
CHANGE_COST = "benchmarks/change_cost.py"
VERSION_MATRIX = "benchmarks/version_matrix.py"
CONCEPTS = "benchmarks/concepts.py"


def styles() -> list[str]:
    """The built-in implementations, in the project's order (its entry points)."""
    return [i.name for i in registry.known() if i.builtin]


def _ranked(scores: dict[str, tuple]) -> list[str]:
    """The styles by score, lowest first, the ones for existing code only left out."""
    return sorted((i for i in scores if i not in EXISTING_CODE_ONLY), key=lambda i: scores[i])


def _existing(said: dict[str, str]) -> list[str]:
    """What the styles left out of the choice (for existing code only) measured, said anyway."""
    return [f"{impl_label(i)} (existing code only) {said[i]}" for i in EXISTING_CODE_ONLY
            if i in said]  # fmt: skip


# --- what a change costs --------------------------------------------------------------------------


def change_totals(record: dict) -> dict[str, dict[str, int]]:
    """Per style: patches checked, lines changed (added and removed) and places touched, summed
    over the changes whose patch was checked."""
    out: dict[str, Counter] = {i: Counter() for i in styles()}
    for per_impl in record["results"].values():
        for impl, found in per_impl.items():
            total = out.setdefault(impl, Counter())
            if found.get("status") == "checked":
                total["checked"] += 1
                total["lines"] += found["added"] + found["removed"]
                total["places"] += len(found["places"])
    return out


def least_change(record: dict | None) -> tuple[list[str], str]:
    """The styles whose changes took the fewest lines (then places), among those with every patch
    checked, those within :data:`TIE` of the fewest with it; and the sentence saying so."""
    if not record:
        return [], f"**what a change costs**: not measured (`python {CHANGE_COST} run`)"
    totals = change_totals(record)
    n = len(record["results"])
    whole = {i: (t["lines"], t["places"]) for i, t in totals.items() if t["checked"] == n}
    ranked = _ranked(whole)
    said = {i: f"{whole[i][0]} lines in {whole[i][1]} places" for i in whole}
    parts = [f"{impl_label(i)} {said[i]}" for i in ranked] + _existing(said)
    partial = [
        f"{impl_label(i)} {t['checked']} of {n} patches checked"
        for i, t in totals.items()
        if t["checked"] < n
    ]
    text = (
        f"**what a change costs** ({n} changes a researcher makes, each made in every style as a "
        f"patch and checked; [table](#what-a-change-costs)): lines changed in all, "
        + "; ".join(parts + partial)
    )
    fewest = whole[ranked[0]][0] if ranked else 0
    return [i for i in ranked if whole[i][0] <= (1 + TIE) * fewest], text


def change_table(record: dict) -> str:
    """Per change and style: the patch's lines (+added −removed) and places, or what went wrong;
    a last row with the totals."""
    header = ["change", *(impl_label(i) for i in styles())]
    rows = []
    for name, per_impl in record["results"].items():
        title = record["changes"][name]["title"]
        cells = []
        for impl in styles():
            found = per_impl.get(impl, {"status": "no patch"})
            if found["status"] == "checked":
                places = len(found["places"])
                cells.append(f"+{found['added']} −{found['removed']}, {places} place"
                             + ("s" if places != 1 else ""))  # fmt: skip
            else:
                cells.append(found["status"])
        rows.append([title, *cells])
    totals = change_totals(record)
    rows.append(
        ["**all, checked**"]
        + [f"**{totals[i]['lines']} lines, {totals[i]['places']} places**" for i in styles()]
    )
    flags = "; ".join(f"{what}: {how}" for what, how in record.get("flags", {}).items())
    return (
        markdown_table(header, rows, "l" + "r" * len(styles()))
        + f"\nNo patch needed, in any style: {flags}.\n"
        + f"\nEach patch is `benchmarks/changes/CHANGE/STYLE.patch`; `{CHANGE_COST}` applied and "
        f"checked every one on {record['started'][:10]} (jax {record['environment']['jax']}). "
        "A place is a function, class or module level whose lines the patch changes.\n"
    )


# --- how long code keeps working ------------------------------------------------------------------


def _since(record: dict, years: int = 2) -> str:
    run = datetime.date.fromisoformat(record["run"])
    return (run - datetime.timedelta(days=365 * years)).isoformat()


NOT_TRIED = ("framework does not import", "does not install")  # the file never ran


def _tried(found: dict) -> bool:
    """Whether the implementation file ran on the release: it installed, the framework imported,
    and the suite started (pytest stopping in a plugin's hook, before any check, ran nothing)."""
    internal = found.get("detail", "").startswith("pytest's internal error")
    return found["status"] not in NOT_TRIED and not internal


def version_summary(record: dict) -> dict[str, dict[str, Any]]:
    """Per style: the series of the last two years its file was tried on, those it passes, those
    where the release itself could not run beside this project's JAX (not tried), the newest's
    version and its deprecation warnings."""
    since = _since(record)
    out = {}
    for dist, versions in record["results"].items():
        for version, tried in versions.items():
            for impl, found in tried["impls"].items():
                s = out.setdefault(impl, {"dist": dist, "tried": [], "passes": [], "untried": [],
                                          "newest": None, "warnings": None})  # fmt: skip
                if tried["date"] >= since:
                    if not _tried(found):
                        s["untried"].append(version)
                    else:
                        s["tried"].append(version)
                    if found["status"] == "passes":
                        s["passes"].append(version)
                if s["newest"] is None:  # newest first
                    s["newest"], s["warnings"] = version, len(found.get("warnings", []))
    return out


def longest_working(record: dict | None) -> tuple[list[str], str]:
    """The styles whose unchanged file passes on the largest share of the releases it was tried on
    (the newest of each series of the last two years), then on the most of them, then with the
    fewest deprecation warnings on the newest; the sentence."""
    if not record:
        return [], f"**releases**: not measured (`python {VERSION_MATRIX}`)"
    summary = version_summary(record)
    score = {
        i: (-len(s["passes"]) / max(len(s["tried"]), 1), -len(s["passes"]), s["warnings"] or 0)
        for i, s in summary.items()
    }
    ranked = _ranked(score)

    def said(s: dict) -> str:
        text = f"{len(s['passes'])} of {len(s['tried'])} ({s['dist']})"
        if s["untried"]:
            text += f", {len(s['untried'])} more not tried (the release did not run the suite here)"
        return text + f", {s['warnings']} deprecation warnings on {s['newest']}"

    words = {i: said(s) for i, s in summary.items()}
    parts = [f"{impl_label(i)} {words[i]}" for i in ranked] + _existing(words)
    text = (
        f"**its file, unchanged, on its framework's releases** (the newest of each series of the "
        f"two years to {record['run']}; [table](#how-long-code-keeps-working)): the suite passes "
        f"on " + "; ".join(parts)
    )
    return [i for i in ranked if score[i] == score[ranked[0]]], text


def versions_table(record: dict) -> str:
    """Per style: the series of the last two years its file passes on; every release tried below,
    folded."""
    summary = version_summary(record)
    rows = [
        [impl_label(i), f"{len(s['passes'])} of {len(s['tried'])}",
         f"{s['dist']} " + (", ".join(s["passes"]) or "none"), ", ".join(s["untried"]) or "-",
         f"{s['warnings']} on {s['newest']}"]
        for i, s in sorted(summary.items(), key=lambda kv: styles().index(kv[0]))
    ]  # fmt: skip
    every = []
    for dist, versions in record["results"].items():
        for version, tried in versions.items():
            for impl, found in tried["impls"].items():
                detail, status = found.get("detail", ""), found["status"]
                if not _tried(found) and status not in NOT_TRIED:
                    status = "not tried (the suite did not start)"
                if status == "passes":
                    detail = f"{len(found.get('warnings', []))} deprecation warnings"
                on = f"{dist} {version} ({tried['date']}, jax {found.get('jax', '-')})"
                every.append(f"    - {impl_label(impl)}, {on}: {status}; {detail}")
    return (
        markdown_table(
            ["style", "passed", "those releases", "not tried", "warnings on the newest"],
            rows,
        )
        + f"\nRun on {record['run']} ({record['machine']}) by `{VERSION_MATRIX}`: the newest "
        "release of each series of the last two years (and older series, to try four of each "
        "framework: listed below, not counted), each on Python 3.11 (3.12 where the release needs "
        "it) with the newest JAX that Python, the release and this project "
        f"({record['project_jax']}) accept: jax 0.10.2 on 3.11, the newest on 3.12 (each "
        "release's own below); the implementation file unchanged, its suite run to its first "
        "failure. Not tried: the style's module of the release (`flax.nnx` for Flax NNX) does not "
        "import beside that JAX, or the suite did not start with it.\n\n"
        + '??? note "Every release tried"\n\n'
        + "\n".join(every)
        + "\n"
    )


# --- what there is to learn -----------------------------------------------------------------------


def fewest_names(record: dict | None) -> tuple[list[str], str]:
    if not record:
        return [], f"**to learn**: not counted (`python {CONCEPTS}`)"
    counts = {i: found["model"]["names"] for i, found in record["impls"].items()}
    ranked = _ranked({i: (n,) for i, n in counts.items()})
    concepts = {i: len(record["impls"][i]["model"]["by_concept"]) for i in counts}
    said = {i: f"{counts[i]} in {concepts[i]} concepts" for i in counts}
    parts = [f"{impl_label(i)} {said[i]}" for i in ranked] + _existing(said)
    text = (
        "**to learn** (the names of JAX, optax and the framework that its model and training "
        "use; [table](#what-there-is-to-learn)): " + "; ".join(parts)
    )
    return [i for i in ranked if counts[i] <= (1 + TIE) * counts[ranked[0]]], text


def concepts_table(record: dict) -> str:
    """Per concept and style, how many of the libraries' names the model and its training use;
    each style's names below, folded."""
    rows = []
    for concept in record["concepts"]:
        counts = [len(record["impls"][i]["model"]["by_concept"].get(concept, [])) for i in styles()]
        if any(counts):
            rows.append([concept, *(str(n) if n else "-" for n in counts)])
    rows.append(["**names**"] + [f"**{record['impls'][i]['model']['names']}**" for i in styles()])
    names = []
    for impl in styles():
        found = record["impls"][impl]["model"]["by_concept"]
        listed = "; ".join(f"{c}: " + ", ".join(f"`{n}`" for n in v) for c, v in found.items())
        names.append(f"    - {impl_label(impl)}: {listed}")
    return (
        markdown_table(
            ["concept", *(impl_label(i) for i in styles())], rows, "l" + "r" * len(styles())
        )
        + f"\nCounted by `{CONCEPTS}` in the sections a project of its own writes (the model, "
        "its state, its loss and step; pure JAX's and Haiku's shared `TrainState` included): the "
        "names reached through an import of "
        + ", ".join(record["libraries"])
        + "; methods called on the objects they return are not counted.\n\n"
        + '??? note "The names, style by style"\n\n'
        + "\n".join(names)
        + "\n"
    )
