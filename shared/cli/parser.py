"""The parser of ``cvae`` and of each of its commands, with the project's voice: a refusal by
argparse is one line naming the flag (no usage block), a long flag is taken only as typed in full,
and ``cvae --version`` names the versions of the whole stack. Each command's parser hands its
arguments to its ``cmd_*`` function (:mod:`cvae_rosetta.cli.training`,
:mod:`cvae_rosetta.cli.commands`).
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from cvae_rosetta import files
from cvae_rosetta.app.run import DEFAULT_EVERY, DEFAULT_IW_SAMPLES, DEFAULT_KEEP
from cvae_rosetta.cli.commands import (
    cmd_bench,
    cmd_convert,
    cmd_evaluate,
    cmd_export,
    cmd_impls,
    cmd_launch,
    cmd_reconstruct,
    cmd_sample,
)
from cvae_rosetta.cli.flags import add_config_flags, number
from cvae_rosetta.cli.jaxstart import add_jax_flags
from cvae_rosetta.cli.training import cmd_compare, cmd_train


class _Version(argparse.Action):
    """``cvae --version``: this package's version and the installed JAX's, then a line for Python
    and each distribution of the stack (``cvae_rosetta.STACK``), read from their metadata (none
    imported)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        import cvae_rosetta

        ours = cvae_rosetta.version_of("cvae-rosetta") or cvae_rosetta.__version__
        jax = cvae_rosetta.version_of("jax")
        print(f"cvae-rosetta {ours}" + (f" (jax {jax})" if jax else " (jax not installed)"))
        stack = cvae_rosetta.installed_versions()
        width = max(map(len, stack))
        for name, found in stack.items():
            shown = "Python" if name == "python" else name
            print(f"  {shown:<{width}}  {found or 'not installed'}")
        sys.stdout.flush()  # a reader gone (``| head -1``) is told here, where main() hears it
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """argparse with the project's voice: a refusal is one line naming the flag (no usage block),
    and a long flag is taken only as typed in full (``--epoch`` is not ``--epochs``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        files.say(f"cvae: error: {self._in_words(message)}")
        self.exit(2)

    def _in_words(self, message: str) -> str:
        """argparse's message in the project's form: ``FLAG: expected X, got Y``."""
        message = re.sub(r"^argument ([^:]+): ", lambda m: f"{m[1].split('/')[0]}: ", message)
        flag = message.split(":")[0]
        if m := re.fullmatch(r"(\S+): not allowed with argument (\S+)", message):
            return f"{m[1]}: expected at most one of {m[2]} and {m[1]}, got both"
        if m := re.fullmatch(r"(.+): invalid choice: (.+) \(choose from (.+)\)", message):
            return f"{m[1]}: expected one of {m[3].replace(chr(39), '')}, got {m[2]}"
        if m := re.fullmatch(r"unrecognized arguments: (\S+).*", message):
            given = m[1].split("=")[0]
            close = difflib.get_close_matches(given, sorted(self._every_flag()), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            return f"{given}: expected a flag of this command{hint}, got an unknown one"
        return message.replace(
            "expected one argument",
            f"expected a value after it (one that starts with '-' is written {flag}=VALUE)",
        )

    def _every_flag(self) -> set[str]:
        """The long flags of this parser and of its commands."""
        flags = {o for a in self._actions for o in a.option_strings if o.startswith("--")}
        for action in self._actions:
            for sub in (getattr(action, "choices", None) or {}).values():
                if isinstance(sub, argparse.ArgumentParser):
                    flags |= {o for a in sub._actions for o in a.option_strings}
        return {f for f in flags if f.startswith("--")}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="cvae", description="One conditional VAE in several JAX frameworks, side by side."
    )
    parser.add_argument(
        "--version", action=_Version, help="print the version of cvae-rosetta and JAX, and exit"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("impls", help="list every known implementation, installed or not")
    p.set_defaults(func=cmd_impls)

    _add_train_command(sub)
    _add_compare_command(sub)

    text = "evaluate a trained run: bounds, active units, conditional accuracy, diversity"
    p = sub.add_parser("evaluate", help=text, description=text)
    p.add_argument(
        "--run", default=None, help="a run directory of cvae train (or cvae compare: every impl)"
    )
    _add_iw_samples(p)
    add_jax_flags(p)
    p.set_defaults(func=cmd_evaluate)

    text = "start a --distributed cvae train as several local processes on loopback"
    p = sub.add_parser(
        "launch",
        help=text,
        description=f"{text}: cvae launch --num-processes 2 -- train --data-parallel sharded ...",
    )
    p.add_argument("--num-processes", type=number(int), default=2, help="processes [2]")
    p.add_argument("--port", type=number(int), default=None, help="coordinator port [a free one]")
    p.add_argument(
        "--timeout", type=number(float), default=None, help="stop them all after S seconds"
    )
    p.add_argument(
        "--oversubscribe",
        action="store_true",
        help="start more processes than this machine has cores (or memory) for",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- train ARGS")
    p.set_defaults(func=cmd_launch, parse=lambda argv: build_parser().parse_args(argv))
    _add_model_commands(sub)
    _add_bench_command(sub)
    return parser


def _add_train_command(sub: Any) -> None:
    text = "train one implementation"
    p = sub.add_parser("train", help=text, description=text)
    p.add_argument(
        "--impl",
        default=None,
        help="a short name (see `cvae impls`) or module:attribute [pure_jax; with "
        "--resume, the run's own]",
    )
    _add_run_flags(p, "runs/IMPL-TIME")
    _add_run_length_flags(p)
    p.add_argument(
        "--debug-nans",
        action="store_true",
        help="check every step with checkify and name the first operation that makes a "
        "NaN (slower)",
    )
    p.add_argument(
        "--tensorboard",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write TensorBoard event files into OUT/tb/: scalars per step and per epoch, "
        "sample and reconstruction grids per epoch (tensorboard --logdir OUT) [on]",
    )
    p.add_argument(
        "--profile-steps",
        default=None,
        metavar="A:B",
        help="trace steps A to B (counted from 1, both included) with jax.profiler into "
        "OUT/profile/, for TensorBoard's profile plugin or Perfetto",
    )
    _add_distributed_flags(p)
    _add_checkpoint_flags(p)
    p.set_defaults(func=cmd_train)


def _add_compare_command(sub: Any) -> None:
    text = "train every implementation from the same initial parameters"
    p = sub.add_parser("compare", help=text, description=text)
    p.add_argument(
        "--impls",
        default=None,
        help="comma-separated names or module:attribute [every installed one]",
    )
    p.add_argument(
        "--resume",
        default=None,
        metavar="DIR",
        help="finish the comparison in DIR that a signal stopped (its own config, "
        "implementations and options; the finished ones are kept)",
    )
    _add_run_flags(p, "runs/compare-TIME")
    p.set_defaults(iw_samples=None)  # given or not: --resume refuses it
    p.set_defaults(func=cmd_compare)


def _add_run_flags(parser: argparse.ArgumentParser, out: str) -> None:
    """The flags ``cvae train`` and ``cvae compare`` share: where the run goes (``out``, the
    default shown), how it reports, the bound's samples, the config and JAX."""
    parser.add_argument("--out", default=None, metavar="DIR", help=f"output directory [{out}]")
    parser.add_argument("--overwrite", action="store_true", help="replace a previous run in --out")
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar, and no line per epoch (the summary at the end stays)",
    )
    _add_iw_samples(parser)
    add_config_flags(parser)
    add_jax_flags(parser)


def _add_run_length_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("how long, and how often it reports")
    group.add_argument(
        "--max-steps",
        type=number(int),
        default=None,
        metavar="N",
        help="end the run after N steps in all, as a finished run (config.json records it; "
        "--resume keeps it, and --resume with a larger N goes on to N) [the run's epochs]",
    )
    group.add_argument(
        "--log-every",
        type=number(int),
        default=None,
        metavar="N",
        help="also a line every N steps: step, epoch, loss, steps/s (0: none) [0]",
    )
    group.add_argument(
        "--eval-every",
        type=number(int),
        default=None,
        metavar="N",
        help="evaluate on the test split every N epochs (and after the last) [1]",
    )


def _add_iw_samples(parser: argparse.ArgumentParser) -> None:
    default = DEFAULT_IW_SAMPLES
    parser.add_argument(
        "--iw-samples",
        type=number(int),
        default=default,
        metavar="K",
        help=f"posterior samples per test example of the importance-weighted bound [{default}]",
    )


def _add_distributed_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("several processes (jax.distributed; see cvae launch)")
    group.add_argument(
        "--distributed",
        action="store_true",
        help="join a multi-process run as one process; what the three flags below do not "
        "give comes from a scheduler's environment (SLURM, Open MPI; docs/clusters.md)",
    )
    group.add_argument(
        "--coordinator",
        default=None,
        metavar="HOST:PORT",
        help="the address of the coordinator service that process 0 hosts, the same for every "
        "process",
    )
    group.add_argument(
        "--num-processes",
        type=number(int),
        default=None,
        metavar="P",
        help="how many processes the run has (with --resume: as many as it was written by)",
    )
    group.add_argument(
        "--process-id",
        type=number(int),
        default=None,
        metavar="I",
        help="this process's number, 0 to P-1 (process 0 writes the run directory)",
    )
    group.add_argument(
        "--verbose",
        action="store_true",
        help="in a run of several processes, show what native libraries print (gloo's "
        "connection lines) on stderr; without it they are dropped, and stdout holds only "
        "cvae's own lines",
    )


def _add_checkpoint_flags(parser: argparse.ArgumentParser) -> None:
    every, keep = DEFAULT_EVERY, DEFAULT_KEEP

    group = parser.add_argument_group("checkpoints and resuming (docs/checkpoints.md)")
    group.add_argument(
        "--checkpoint-every",
        type=number(int),
        default=every,
        metavar="K",
        help=f"write a checkpoint every K steps, and always at the end (0: only at the end) "
        f"[{every}]",
    )
    group.add_argument(
        "--checkpoint-every-seconds",
        type=number(float),
        default=0.0,
        metavar="S",
        help="also write one when S seconds have passed since the previous one, whichever of K "
        "and S comes first (0: steps only) [0]",
    )
    group.add_argument(
        "--keep-checkpoints",
        type=number(int),
        default=keep,
        metavar="N",
        help=f"keep the latest N checkpoints [{keep}]",
    )
    group.add_argument(
        "--resume",
        default=None,
        metavar="DIR",
        help="continue the run in DIR from its latest checkpoint (its own config; --epochs may "
        "extend it; --impl may be another implementation)",
    )
    group.add_argument(
        "--resume-latest-good",
        action="store_true",
        help="with --resume: if the latest checkpoint is damaged, continue from the newest intact "
        "one (damaged ones are moved to DIR/checkpoints.damaged)",
    )


def _add_out_file(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--out", default=None, metavar="FILE", help=f"{text} (required)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.set_defaults(out_kind="a file")


def _add_run(parser: argparse.ArgumentParser, *, impl: bool = True) -> None:
    parser.add_argument("--run", default=None, metavar="DIR", help="a run directory of cvae train")
    if impl:
        parser.add_argument(
            "--impl", default=None, help="the implementation to load it into [the run's own]"
        )


def _add_model_commands(sub: Any) -> None:
    text = "write a run's checkpoint as one canonical NPZ (parameters, optimiser state, metadata)"
    p = sub.add_parser("convert", help=text, description=text)
    _add_run(p, impl=False)
    _add_out_file(p, "the .npz file to write")
    p.add_argument(
        "--step", type=number(int), default=None, help="which checkpoint [the newest intact one]"
    )
    add_jax_flags(p)
    p.set_defaults(func=cmd_convert)

    text = "generate images of given labels from a trained run"
    p = sub.add_parser("sample", help=text, description=text)
    _add_run(p)
    p.add_argument("--label", default=None, help="a label, or comma-separated labels")
    p.add_argument("--n", type=number(int), default=16, help="images per label [16]")
    p.add_argument(
        "--seed", type=number(int), default=None, help="seed of the noise [the run's sample key]"
    )
    _add_out_file(p, "a .png grid, or .npz with images, labels and image_shape")
    add_jax_flags(p)
    p.set_defaults(func=cmd_sample)

    text = "reconstruct test examples of a trained run's data set"
    p = sub.add_parser("reconstruct", help=text, description=text)
    _add_run(p)
    p.add_argument("--n", type=number(int), default=16, help="test examples [16]")
    _add_out_file(p, "a .png grid, or .npz with x, labels, reconstructions and image_shape")
    add_jax_flags(p)
    p.set_defaults(func=cmd_reconstruct)

    text = "export a trained run's generator, encoder and decoder with jax.export (StableHLO)"
    p = sub.add_parser("export", help=text, description=text)
    _add_run(p)
    p.add_argument("--out", default=None, metavar="DIR", help="the directory to write (required)")
    p.add_argument("--overwrite", action="store_true", help="replace a previous export in --out")
    p.add_argument(
        "--platforms", default=None, help="comma-separated: cpu, cuda, rocm, tpu [this machine's]"
    )
    add_jax_flags(p)
    p.set_defaults(func=cmd_export)


def _add_bench_command(sub: Any) -> None:
    from cvae_rosetta.bench.settings import MIN_STEPS, Settings

    text = "measure every implementation's step: compile, step time, overhead, FLOPs, scaling"
    p = sub.add_parser("bench", help=text, description=f"{text} (docs/performance.md)")
    p.add_argument("--out", default=None, metavar="DIR", help="output directory [runs/bench-TIME]")
    p.add_argument("--overwrite", action="store_true", help="replace a previous benchmark in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--quick",
        action="store_true",
        help="about a minute and a half on two cores: batch sizes 8,256, 5 rounds, fewer steps, "
        "pure JAX only in the data-parallel cases, no bfloat16, no step variants (flags given "
        "explicitly still apply)",
    )
    default = Settings()
    for name, metavar, text in (
        ("impls", "A,B", "implementations [every installed one; pure_jax always]"),
        ("batch-sizes", "B,B", f"batch sizes [{_joined(default.batch_sizes)}]"),
        ("rounds", "N", f"timed rounds, interleaved across every path [{default.rounds}]"),
        ("steps", "K", f"at most K steps per round [{default.steps}]"),
        (
            "epoch-examples",
            "E",
            f"a round covers about E examples (E / batch steps, at least {MIN_STEPS}) "
            f"[{default.epoch_examples}]",
        ),
        ("unrolls", "U,U", f"lax.scan unroll values of pure JAX [{_joined(default.unrolls)}]"),
        ("devices", "N,N", f"device counts, data parallelism [{_joined(default.devices)}]"),
        ("mechanisms", "M,M", f"data-parallel mechanisms [{_joined(default.mechanisms)}]"),
        ("parallel-batch", "B", f"global batch, data parallelism [{default.parallel_batch}]"),
        ("parallel-impls", "A,B", "implementations, data parallelism [every benchmarked one]"),
        ("roof-size", "N", f"N of the N x N matmul roof [{default.roof_size}]"),
        (
            "precision-batches",
            "B,B",
            "batch sizes of bfloat16 against float32, or none "
            f"[{_joined(default.precision_batches)}]",
        ),
        (
            "technique-batches",
            "B,B",
            "batch sizes of pure JAX's step variants (no donation, optax.flatten, optax's "
            f"clipping), or none [{_joined(default.technique_batches)}]",
        ),
    ):
        p.add_argument(f"--{name}", default=None, metavar=metavar, help=text)
    add_jax_flags(p, cache_default=False)
    p.set_defaults(func=cmd_bench)


def _joined(values: Sequence[Any]) -> str:
    return ",".join(map(str, values))
