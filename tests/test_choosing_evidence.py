"""The choosing page's evidence beyond speed, and the rows that read it.

- Every change's patch applies to the implementations as they are (``benchmarks/change_cost.py
  applies``: CI fails when a change to a file breaks one), every style has every change, and the
  committed result file counts the committed patches (their lines, added and removed).
- The concepts record is what the code gives now.
- The decision rows choose by their own evidence: made-up records in which another style wins
  put that style in the row (research: the fewest lines changed, every patch checked; production:
  the largest share of releases passed; learning: the fewest names), never one whose maintainers
  tell new projects to use another (Haiku), and the row cites its evidence.
- A style whose program is pure JAX's wherever fingerprinted is not ranked behind pure JAX on a
  machine without fingerprints (its ratio is the machine's variation).
- The maintained column says where a description was not searched.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
sys.path.insert(0, str(BENCHMARKS))
sys.path.insert(0, str(ROOT / "docs_build"))  # the choosing page's decision and evidence
import change_cost  # noqa: E402  (benchmarks/change_cost.py)
import evidence  # noqa: E402  (docs_build/evidence.py)
from decision import NEEDS, STYLE_MIND, decision  # noqa: E402  (docs_build/decision.py)

STYLES = evidence.styles()


def rows_of(table: str) -> dict[str, list[str]]:
    """The decision table's rows by need: its cells."""
    rows = {}
    for line in table.splitlines():
        if line.startswith("| ") and not line.startswith("| if you need"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0]] = cells
    return rows


def need(table: str, start: str) -> list[str]:
    return next(cells for name, cells in rows_of(table).items() if name.startswith(start))


# --- the patches ----------------------------------------------------------------------------------


def test_every_patch_applies_to_the_implementations_as_they_are():
    assert change_cost.applies() == []


def test_every_style_has_every_change():
    missing = [
        f"{change}/{impl}.patch"
        for change in change_cost.CHANGES
        for impl in change_cost.IMPLS
        if not change_cost.patch_path(change, impl).is_file()
    ]
    assert not missing, missing


def test_the_result_file_counts_the_committed_patches():
    """Lines added and removed, read from each patch again: a patch made again without running
    the script leaves the table stale, and fails here."""
    record = json.loads((RESULTS / "change_cost.json").read_text())
    assert set(record["results"]) == set(change_cost.CHANGES)
    for change, per_impl in record["results"].items():
        for impl, found in per_impl.items():
            assert found["status"] == "checked", (change, impl, found.get("detail"))
            lines = change_cost.patch_path(change, impl).read_text().splitlines()
            added = sum(1 for x in lines if x.startswith("+") and not x.startswith("+++"))
            removed = sum(1 for x in lines if x.startswith("-") and not x.startswith("---"))
            assert (found["added"], found["removed"]) == (added, removed), (change, impl)


def test_places_are_the_functions_whose_lines_a_patch_changes(tmp_path):
    before, after = tmp_path / "a", tmp_path / "b"
    for root, body in ((before, "    return 1\n"), (after, "    return 2\n")):
        (root / "impls").mkdir(parents=True)
        (root / "impls" / "m.py").write_text(f"X = 1\n\n\nclass A:\n  def f(self):\n{body}")
    patch = (
        "--- a/impls/m.py\n+++ b/impls/m.py\n@@ -4,3 +4,3 @@\n class A:\n   def f(self):\n"
        "-    return 1\n+    return 2\n"
    )
    assert change_cost.count(patch, before, after) == {
        "added": 1, "removed": 1, "files": ["impls/m.py"], "places": ["impls/m.py: A.f"],
    }  # fmt: skip


def test_the_concepts_record_is_what_the_code_gives():
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "concepts.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


# --- made-up records ------------------------------------------------------------------------------


def change_record(lines: dict[str, int], failing: tuple[str, ...] = ()) -> dict:
    """Two changes, each ``lines[impl]`` lines in one place for every style (failing: one
    patch that fails its check)."""
    results = {}
    for change in ("gelu", "dropout"):
        results[change] = {
            impl: {"status": "fails" if impl in failing and change == "dropout" else "checked",
                   "added": n, "removed": 0, "files": ["impls/x.py"], "places": ["impls/x.py: f"]}
            for impl, n in lines.items()
        }  # fmt: skip
    return {
        "started": "2026-12-06 00:00:00 +0000",
        "environment": {"jax": "0.10.2"},
        "changes": {c: {"title": c, "what": "", "checked": ""} for c in results},
        "flags": {"a wider layer": "a flag"},
        "results": results,
    }


def version_record(passes: dict[str, int], tried: int = 4) -> dict:
    """``tried`` series of the last two years per style, the newest ``passes[impl]`` of them
    passing."""
    results: dict = {}
    for impl, n in passes.items():
        dist = f"dist-{impl}"
        results[dist] = {
            f"1.{k}": {"date": f"2026-0{9 - k}-01", "impls": {impl: {
                "status": "passes" if k < n else "fails", "detail": "x", "warnings": [],
                "jax": "0.10.2"}}}
            for k in range(tried)
        }  # fmt: skip
    return {"run": "2026-12-06", "machine": "x", "project_jax": "jax", "results": results}


def concepts_record(names: dict[str, int]) -> dict:
    return {
        "libraries": ["jax"],
        "concepts": ["transforms"],
        "impls": {
            i: {
                "model": {"names": n, "by_concept": {"transforms": [f"jax.n{k}" for k in range(n)]}}
            }
            for i, n in names.items()
        },
    }


EVEN = dict.fromkeys(STYLES, 20)


def test_the_research_row_chooses_the_fewest_lines_changed():
    table = decision([], None, {"change_cost": change_record(EVEN | {"keras": 3})})
    cells = need(table, "Research code")
    assert cells[1] == "Keras 3", cells
    assert "**what a change costs**" in cells[2] and "Keras 3 6 lines in 2 places" in cells[2]
    assert cells[4] == evidence_mind("keras")


def test_styles_within_a_tenth_of_the_fewest_lines_are_named_together():
    """Counts written by different hands differ by a few lines for the same idea."""
    record = change_record(EVEN | {"keras": 10, "equinox": 11, "flax_nnx": 12})
    cells = need(decision([], None, {"change_cost": record}), "Research code")
    assert cells[1] == "Keras 3 or Equinox", cells  # 20 and 22 lines; 24 is beyond a tenth


def test_a_style_with_a_failing_patch_is_not_chosen_however_short():
    record = change_record(EVEN | {"keras": 3, "equinox": 5}, failing=("keras",))
    cells = need(decision([], None, {"change_cost": record}), "Research code")
    assert cells[1] == "Equinox", cells
    assert "Keras 3 1 of 2 patches checked" in cells[2]


def test_the_production_row_chooses_the_most_releases_passed_never_haiku():
    passes = dict.fromkeys(STYLES, 1) | {"equinox": 3, "haiku": 4}
    cells = need(decision([], None, {"version_matrix": version_record(passes)}), "A production")
    assert cells[1] == "Equinox", cells
    assert "Equinox 3 of 4" in cells[2] and "Haiku (existing code only) 4 of 4" in cells[2]


def test_a_release_that_does_not_import_here_is_not_held_against_the_file():
    """A framework release that does not import beside this project's JAX never ran the file: it
    is said, and left out of the share (2 of 2 tried beats 3 of 4)."""
    record = version_record(dict.fromkeys(STYLES, 3) | {"flax_nnx": 2})
    for version, tried in record["results"]["dist-flax_nnx"].items():
        if version in ("1.2", "1.3"):
            tried["impls"]["flax_nnx"]["status"] = "framework does not import"
    cells = need(decision([], None, {"version_matrix": record}), "A production")
    assert cells[1] == "Flax NNX", cells
    assert "Flax NNX 2 of 2 (dist-flax_nnx), 2 more not tried" in cells[2]


def test_the_learning_row_chooses_the_fewest_names():
    names = dict.fromkeys(STYLES, 30) | {"flax_linen": 9, "haiku": 5}
    cells = need(decision([], None, {"concepts": concepts_record(names)}), "Learning JAX")
    assert cells[1] == "Flax Linen", cells
    assert "**to learn**" in cells[2] and "Flax Linen 9 in 1 concepts" in cells[2]


def test_a_row_without_its_record_says_so_and_keeps_its_default():
    table = decision([], None, {})
    for start, what in (("Research", "what a change costs"), ("A production", "releases"),
                        ("Learning", "to learn")):  # fmt: skip
        cells = need(table, start)
        assert f"**{what}**: not" in cells[2], cells


def evidence_mind(impl: str) -> str:
    return STYLE_MIND[impl]


def test_every_need_chosen_by_evidence_has_a_mind_for_every_style():
    assert set(STYLE_MIND) == set(STYLES) - set(evidence.EXISTING_CODE_ONLY)
    assert {kind for _, _, kind, _, _ in NEEDS} >= {"learn", "change", "versions"}


def test_the_evidence_tables_render_from_their_records():
    changes = evidence.change_table(change_record(EVEN | {"keras": 3}))
    assert (
        "| gelu |" in changes and "+3 −0, 1 place" in changes and "a wider layer: a flag" in changes
    )
    record = version_record({"equinox": 1})
    stopped = record["results"]["dist-equinox"]["1.3"]["impls"]["equinox"]
    stopped["detail"] = "pytest's internal error: ImportError"  # the suite did not start
    versions = evidence.versions_table(record)
    assert "- Equinox, dist-equinox 1.0 (2026-09-01, jax 0.10.2): passes;" in versions
    assert "| Equinox | 1 of 3 | dist-equinox 1.0 | 1.3 |" in versions  # the table and the list
    assert "1.3 (2026-06-01, jax 0.10.2): not tried (the suite did not start); pytest's" in versions
    names = evidence.concepts_table(concepts_record(dict.fromkeys(STYLES, 2)))
    assert "| transforms |" in names and "`jax.n1`" in names


# --- the committed records ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def committed_table() -> str:
    from cvae_rosetta.bench.results import load

    results = [load(RESULTS / n) for n in ("bench_cpu.json", "bench_gpu.json")]
    maintenance = json.loads((RESULTS / "maintenance.json").read_text())
    records = {
        n: json.loads((RESULTS / f"{n}.json").read_text()) if (RESULTS / f"{n}.json").is_file()
        else None
        for n in ("change_cost", "version_matrix", "concepts")
    }  # fmt: skip
    return decision(results, maintenance, records)


def test_a_style_with_pure_jax_s_program_is_not_ranked_behind_it_on_the_machines_variation(
    committed_table,
):
    """Flax NNX compiles to pure JAX's program at every CPU batch (equal fingerprints) and has the
    same counts on the GPU, which recorded no fingerprint: its 1.01x there is the machine's."""
    use = need(committed_table, "Large batches")[1]
    assert "Flax NNX" in use and "then Flax NNX" not in use, use


def test_the_maintained_column_says_where_nothing_was_searched(committed_table):
    keras = need(committed_table, "Keras habits")[3]
    assert "not searched" in keras and "](https://pypi.org/project/keras/" in keras
