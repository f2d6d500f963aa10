"""Every refusal the CLI's tests cover, run for real: the table in docs/cli.md.

Each case is a command as a user types it. It runs as its own process (``python -m cvae_rosetta``)
in a scratch directory that holds only the files the cases name (a config that exits, a damaged
``mnist.npz``, a plain file), and the table shows what the user sees: the status and the one line
of standard error. ``tests/test_refusals.py`` runs every case again and checks each line names the
flag as typed (the config field in brackets where one is set), that nothing else was printed, that
no usage block was printed, that the status is 2 and that nothing was written; and that the table
here is the one the cases print now (digits aside: memory and cores are the machine's).

    python docs_build/refusals.py           # run every case, rewrite the table in docs/cli.md
    python docs_build/refusals.py --check   # run every case, fail if the table differs
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "cli.md"
BEGIN, END = "<!-- refusals:begin -->", "<!-- refusals:end -->"


@dataclass(frozen=True)
class Case:
    """``cvae COMMAND`` as typed, and the words its one line must start with after ``cvae:
    error:``: the flag as typed, the config field in brackets where the flag sets one."""

    command: str
    names: str


CASES: tuple[Case, ...] = (
    # cvae train: config flags, each named as typed with its field
    Case("train --epochs 0", "--epochs (train.epochs)"),
    Case("train --epochs=-1", "--epochs (train.epochs)"),
    Case("train --epochs 99999999999999999999999", "--epochs (train.epochs)"),
    Case("train --devices 2", "--devices (train.devices)"),
    Case(
        "train --batch-size 30 --devices 4 --data-parallel sharded",
        "--devices, --batch-size (train.devices, data.batch_size)",
    ),
    Case(
        "train --devices 3 --data-parallel sharded",
        "--devices, --batch-size (train.devices, data.batch_size)",
    ),
    Case("train --batch-size 5000", "--batch-size (data.batch_size)"),
    Case("train --latent-dim abc", "--latent-dim (model.latent_dim)"),
    Case("train --latent-dim 100000000", "--latent-dim (model.latent_dim)"),
    Case("train --encoder-dims 256,,64", "--encoder-dims (model.encoder_dims"),
    Case("train --input-dim 784", "--input-dim (model.input_dim)"),
    Case("train --compute-dtype float16", "--compute-dtype (model.compute_dtype)"),
    Case("train --loss l2", "--loss (loss.kind)"),
    Case("train --beta=-0.1", "--beta (loss.beta)"),
    Case("train --learning-rate nan", "--learning-rate (optim.learning_rate)"),
    Case("train --schedule cosine --warmup-steps 5", "--warmup-steps (optim.warmup_steps)"),
    Case("train --seed=-1", "--seed (train.seed)"),
    Case("train --data cifar10", "--data (data.name)"),
    # a value from a --config file keeps the name the file gives it
    Case("train --config epochs.toml", "train.epochs"),
    # cvae train: the flags that are not config fields
    Case("train --max-steps 0", "--max-steps"),
    Case("train --checkpoint-every=-1", "--checkpoint-every"),
    Case("train --iw-samples 0", "--iw-samples"),
    Case("train --impl tensorflow", "--impl"),
    Case("train --impl flax-nnx", "--impl"),
    Case("train --out ''", "--out"),
    Case("train --out a_file/run", "--out"),
    Case("train --resume nowhere", "--resume"),
    Case("train --config exits.py", "--config"),
    Case("train --platform tpu", "--platform"),
    Case("train --data mnist", "--data-dir"),
    Case("train --data mnist --data-dir damaged", "--data-dir (data.data_dir)"),
    Case("train --data digits --data-dir damaged", "--data-dir (data.data_dir)"),
    # what argparse refuses, in the same one line
    Case("train --epoch 3", "--epoch"),
    Case("train --epochs", "--epochs"),
    Case("train --decoder-dims -1,5", "--decoder-dims"),
    Case("train --compilation-cache x --no-compilation-cache", "--no-compilation-cache"),
    Case("train --no-such-flag", "--no-such-flag"),
    # the other commands
    Case("compare --impls ''", "--impls"),
    Case("compare --impls pure_jax,tensorflow", "--impls"),
    Case("launch --num-processes 1000 -- train", "--num-processes"),
    Case("launch --num-processes 0 -- train", "--num-processes"),
    Case("launch --num-processes 2 -- train --epochs 1", "--num-processes"),
    Case("launch --num-processes 2 -- train --data-parallel pmap", "--data-parallel"),
    Case("evaluate --run missing", "--run"),
    Case("evaluate --run missing --iw-samples 0", "--iw-samples"),
    Case("sample --run missing", "--out"),
    Case("sample --run missing --out samples.png", "--run"),
    Case("sample --run missing --out samples.jpg", "--out"),
    Case("reconstruct --run missing --out r.png", "--run"),
    Case("export --run missing --out model", "--run"),
    Case("bench --impls tensorflow", "--impls"),
    Case("bench --batch-sizes 0,8", "--batch-sizes"),
)

# The files the cases name, made in each case's scratch directory before it runs.
FILES: dict[str, bytes] = {
    "exits.py": b"import sys\n\n\ndef get_config():\n    sys.exit(3)\n",
    "epochs.toml": b"[train]\nepochs = 0\n",
    "damaged/mnist.npz": b"PK\x03\x04 not a zip archive",
    "a_file": b"",
}


@dataclass(frozen=True)
class Seen:
    """What a case printed and left: its status, its standard error and output, and the paths in
    its scratch directory that were not there before it ran."""

    case: Case
    status: int
    stderr: str
    stdout: str
    written: tuple[str, ...]

    @property
    def line(self) -> str:
        return self.stderr.strip()


def _paths(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def run(case: Case) -> Seen:
    """``cvae CASE`` in a scratch directory of its own, as a process of its own."""
    with tempfile.TemporaryDirectory(prefix="cvae-refusal-") as scratch:
        root = Path(scratch)
        for name, content in FILES.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(content)
        before = _paths(root)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CVAE_")}
        env |= {"JAX_PLATFORMS": "cpu", "CVAE_COMPILATION_CACHE": "off"}
        env.pop("PYTHONPATH", None)
        done = subprocess.run(
            [sys.executable, "-m", "cvae_rosetta", *shlex.split(case.command)],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        written = tuple(sorted(_paths(root) - before))
    return Seen(case, done.returncode, done.stderr, done.stdout, written)


def run_all(cases: tuple[Case, ...] = CASES) -> list[Seen]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(run, cases))


def _cell(text: str) -> str:
    return "`" + text.replace("|", "\\|") + "`"


def table(seen: list[Seen]) -> str:
    rows = [
        "| you type | status | the one line it prints |",
        "|---|---|---|",
        *(f"| {_cell('cvae ' + s.case.command)} | {s.status} | {_cell(s.line)} |" for s in seen),
    ]
    return "\n".join(rows)


def block(seen: list[Seen]) -> str:
    return f"{BEGIN}\n{table(seen)}\n{END}"


def committed(page: str = "") -> str:
    text = page or PAGE.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def masked(text: str) -> str:
    """The table as words: every run of digits as ``#`` (the memory and cores of two lines are the
    machine's), whether each known implementation is installed (the environment's), and the reason
    JAX gives for a platform it cannot start (its own words, which change between releases)."""
    text = re.sub(r"\((?:not )?installed\)", "(...)", text)
    text = re.sub(r"\(Unable to initialize backend[^)]*\)", "(...)", text)
    return re.sub(r"\d[\d,.]*", "#", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the table differs")
    args = parser.parse_args(argv)
    now = block(run_all())
    text = PAGE.read_text()
    if args.check:
        if masked(committed(text)) != masked(now):
            print(f"{PAGE}: the refusals' table is out of date: python {__file__}")
            return 1
        return 0
    PAGE.write_text(text.replace(committed(text), now))
    return 0


if __name__ == "__main__":
    sys.exit(main())
