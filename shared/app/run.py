"""A run's plain data: what it is asked to do, where it stands, and what it did.

Nothing here imports JAX when the module is imported (a JAX value is only made inside a method
that needs one), so the CLI builds its parser, defaults included, before JAX starts.

- What a run trains and how: :class:`Job` (an implementation on a config and a data set, from
  where it stands), :class:`Control` (when to checkpoint, stop, evaluate, trace and report) and
  :class:`Callbacks` (what hears of each record, checkpoint and epoch), the three objects
  :func:`cvae_rosetta.app.trainer.train` takes; :class:`Options`, how a whole run is carried out,
  as ``cvae train``'s flags set it, each field checked by :mod:`cvae_rosetta.app.optionchecks`
  (the steps it traces: :class:`cvae_rosetta.app.profiling.ProfileSteps`).
- Where a run stands: :class:`Position`, :class:`Progress` and the run's keys, :class:`RunKeys`.
- What it did: :class:`TrainResult` (the training loop's) and :class:`Outcome` (a whole run's, in
  its directory).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cvae_rosetta.app.optionchecks import (
    check_debug_nans,
    check_iw_samples,
    check_options,
    check_run_control,
)
from cvae_rosetta.app.profiling import ProfileSteps
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import ConfigError

if TYPE_CHECKING:
    import jax

METRICS = ("loss", "recon", "kl")
Record = dict[str, Any]

DEFAULT_EVERY = 1000  # steps between checkpoints (and one at the end)
DEFAULT_KEEP = 3  # checkpoints kept
DEFAULT_IW_SAMPLES = 64  # posterior samples per test example of the importance-weighted bound
PROFILE_DIR = "profile"  # the jax.profiler trace of Options.profile_steps, in the run directory
TB_DIR = "tb"  # the TensorBoard event files (cvae_rosetta.app.tensorboard), in the run directory


# --- where a run stands ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunKeys:
    """The keys of a run, all derived from its seed, none reused for two purposes."""

    init: jax.Array
    shuffle: jax.Array
    train: jax.Array  # the run key of SPEC section 3: step t uses fold_in(train, t)
    eval: jax.Array
    sample: jax.Array

    @classmethod
    def from_seed(cls, seed: int) -> RunKeys:
        import jax

        return cls(*_five()(jax.random.key(seed)))  # the key eagerly: a seed of up to 64 bits


@functools.cache
def _five() -> Callable[[Any], list[Any]]:
    """A key split in five as one program (eagerly: one per operation)."""
    import jax

    return jax.jit(lambda key: list(jax.random.split(key, 5)))


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a run stands: ``step`` steps done; the next is batch ``batch`` of epoch ``epoch``
    (both counted from 0), so ``step == epoch * num_batches + batch``."""

    step: int
    epoch: int
    batch: int


@dataclasses.dataclass(frozen=True)
class Progress:
    """What a run needs besides its train state to go on exactly where it stopped."""

    position: Position
    # [loss, recon, kl] of each step of the current epoch done so far (their means are the
    # epoch record's train metrics); floats of float32 values, exact in JSON
    epoch_metrics: tuple[tuple[float, float, float], ...] = ()
    records: int = 0  # records made so far (metrics.jsonl lines), every step up to position.step
    seconds: float = 0.0  # training seconds so far (the epoch records' "seconds")

    @classmethod
    def start(cls) -> Progress:
        return cls(Position(0, 0, 0))


# --- what a run is asked to do --------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """How a run is carried out, beside what it computes (the :class:`Config`)."""

    impl: str = "pure_jax"  # a built-in name or "module:attribute"
    checkpoint_every: int = DEFAULT_EVERY  # steps between checkpoints; 0: at the end
    checkpoint_every_seconds: float = 0.0  # seconds between checkpoints too; 0: steps only
    keep_checkpoints: int = DEFAULT_KEEP
    iw_samples: int = DEFAULT_IW_SAMPLES  # of the importance-weighted bound
    debug_nans: bool = False  # every step under checkify (serial runs only)
    progress: bool = True  # a progress bar on a terminal, a line per epoch elsewhere (stderr)
    overwrite: bool = False  # replace a previous run directory (one with a config.json)
    latest_good: bool = False  # resume: skip damaged newest checkpoints
    tensorboard: bool = True  # TensorBoard event files in RUN/tb/
    profile_steps: str | tuple[int, int] | None = None  # "A:B": trace steps A..B into RUN/profile/
    # end the run after this many steps in all (a resumed run's included), as a finished run; the
    # run's config.json records it and a resume keeps it unless given another (None: the run's)
    max_steps: int | None = None
    log_every: int = 0  # also a line every N steps (step, epoch, loss, steps/s); 0: none
    eval_every: int = 1  # evaluate the test split every N epochs, and always after the last

    def check(self, config: Config) -> Options:
        """Refuse bad options before anything is read or written."""
        check_run_control(self.max_steps, self.log_every, self.eval_every)
        check_options(self.checkpoint_every, self.keep_checkpoints, self.checkpoint_every_seconds)
        check_iw_samples(self.iw_samples)
        check_debug_nans(self.debug_nans, config)
        if not isinstance(self.tensorboard, bool):
            raise ConfigError(f"tensorboard: expected True or False, got {self.tensorboard!r}")
        self.profile(Path("."))
        return self

    def profile(self, workdir: Path) -> ProfileSteps | None:
        """The steps to trace into ``workdir``'s profile directory, if any."""
        return ProfileSteps.parse(self.profile_steps, Path(workdir) / PROFILE_DIR)

    def control(self, workdir: Path, decide: Callable[[int, bool], tuple[bool, bool]]) -> Control:
        """How the training loop carries out a run of these options written into ``workdir``,
        checkpointing and stopping as ``decide`` says."""
        return Control(
            decide=decide,
            max_steps=self.max_steps,
            eval_every=self.eval_every,
            debug_nans=self.debug_nans,
            profile=self.profile(workdir),
            progress=self.progress,
            log_every=self.log_every,
        )


@dataclass(frozen=True)
class Job:
    """What a run trains: ``impl`` on ``config`` and ``dataset`` with the run's ``keys``, from
    ``start`` (None: step 0), after the records ``history`` made before it (a resumed run's).
    ``name``: what its lines and pictures call it (None: the implementation's name)."""

    impl: Any  # an Implementation (cvae_rosetta.spec.protocol)
    config: Config
    dataset: Any  # a cvae_rosetta.app.data.Dataset
    keys: RunKeys
    start: Progress | None = None
    history: Sequence[Record] = ()
    name: str | None = None

    @property
    def label(self) -> str:
        return self.name or getattr(self.impl, "name", "train")


@dataclass(frozen=True)
class Control:
    """How the training loop carries out a run: ``decide(t, boundary)`` answers, after step
    ``t``, (write a checkpoint, stop) (:class:`cvae_rosetta.app.signals.Cadence`; None: neither);
    ``max_steps`` ends the run there; the test split is evaluated every ``eval_every`` epochs (in
    chunks of ``eval_batch_size``); ``debug_nans`` runs each step under ``checkify``; ``profile``
    traces chosen steps; ``progress`` and ``log_every`` say what it shows on stderr."""

    decide: Callable[[int, bool], tuple[bool, bool]] | None = None
    max_steps: int | None = None
    eval_every: int = 1
    eval_batch_size: int = 1024
    debug_nans: bool = False
    profile: ProfileSteps | None = None
    progress: bool = True
    log_every: int = 0


@dataclass(frozen=True)
class Callbacks:
    """What hears of a run as it goes: ``on_record(record)`` every record as it is made,
    ``on_checkpoint(state, progress)`` the single-device state to checkpoint, ``on_epoch(state,
    record)`` the single-device state after each epoch's record."""

    on_record: Callable[[Record], None] | None = None
    on_checkpoint: Callable[[Any, Progress], None] | None = None
    on_epoch: Callable[[Any, Record], None] | None = None


# --- what a run did -------------------------------------------------------------------------------


@dataclasses.dataclass
class TrainResult:
    state: Any
    records: list[Record]  # what metrics.jsonl holds: "step" and "epoch" events
    compile_seconds: float  # trace + lower + compile of the step
    steps_per_second: float  # steady state, compilation and evaluation excluded
    progress: Progress | None = None  # where the run stands now
    stopped: bool = False  # stopped early on request (should_stop), after a checkpoint
    steps: int = 0  # steps taken by this call (0: a resumed run with nothing left to train)

    def epochs(self) -> list[Record]:
        return [r for r in self.records if r["event"] == "epoch"]

    def final(self) -> Record:
        return self.epochs()[-1]


@dataclass
class Outcome:
    """What a run did: where, with which implementation (``impl``: its name, or its label in a
    comparison), its final figures and files."""

    workdir: Path
    impl: str
    dataset: str
    config: Config
    result: TrainResult | None  # None: a run that did nothing now (finished before)
    summary: dict[str, Any] = field(default_factory=dict)  # summary.json (a comparison's row)
    evaluation: dict[str, Any] = field(default_factory=dict)
    written: list[str] = field(default_factory=list)
    stopped_by: int = 0  # the signal that stopped the run (a checkpoint was written), 0 if none
    records: list[Record] = field(default_factory=list)  # metrics.jsonl's, the run's whole
    params: Any = None  # the final parameters, canonical, where written

    @property
    def stopped(self) -> bool:
        """Stopped by a signal, in training or in its final outputs (a checkpoint was written)."""
        return bool(self.stopped_by)
