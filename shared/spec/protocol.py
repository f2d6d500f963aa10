"""SPEC section 6: the protocol every implementation meets, its adapter, and the loader.

An implementation module writes its framework's own functions, then hands them to :class:`Adapter`
in its last section. Of an implementation's calls, the adapter is the only place that validates
input (SPEC section 7) and draws the noise of a call (SPEC section 3), so every implementation
refuses the same bad input with the same message and sees the same noise for the same key.

:func:`load` resolves an implementation from a short name registered under the entry-point group
``cvae_rosetta.impls`` or from any ``"module:attribute"`` string, one outside the repo included:
a module found on no entry of ``sys.path`` is looked for in the working directory too, as
``python -m`` would, so ``pytest --impl mypackage.my_impl:implementation`` and ``cvae train --impl
...`` both work from the folder that holds ``mypackage`` (the conformance plugin and the command
line load through here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from cvae_rosetta.spec import canonical, registry
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import ConfigError, ImplementationNotFound, field_error
from cvae_rosetta.spec.losses import Metrics
from cvae_rosetta.spec.model import noise
from cvae_rosetta.spec.registry import ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
from cvae_rosetta.spec.registry import ImplInfo as ImplInfo
from cvae_rosetta.spec.validation import (
    Batch,
    check_batch,
    check_features,
    check_labels,
    check_latent,
)

MEMBERS = (
    "name",
    "init",
    "from_canonical",
    "to_canonical",
    "loss",
    "train_step",
    "encode",
    "decode",
)


@runtime_checkable
class Implementation(Protocol):
    """What the conformance suite touches, and nothing more."""

    name: str

    def init(self, key: jax.Array, config: Config) -> Any: ...

    def from_canonical(self, params: canonical.Canonical, config: Config) -> Any: ...

    def to_canonical(self, state: Any) -> canonical.Canonical: ...

    def loss(self, state: Any, batch: Batch, key: jax.Array) -> tuple[jax.Array, Metrics]: ...

    def train_step(self, state: Any, batch: Batch, key: jax.Array) -> tuple[Any, Metrics]: ...

    def encode(self, state: Any, x: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]: ...

    def decode(self, state: Any, z: jax.Array, c: jax.Array) -> jax.Array: ...


def _config(value: Any) -> Config:
    if not isinstance(value, Config):
        raise field_error(ConfigError, "config", "a cvae_rosetta.spec.config.Config", value)
    return value


@jax.jit
def _copy(tree: Any) -> Any:
    """Fresh buffers, so that donating a state never invalidates the caller's parameter tree: one
    program for the whole tree (an eager copy per leaf would be one per shape)."""
    return jax.tree.map(lambda leaf: jnp.array(leaf, copy=True), tree)


@dataclasses.dataclass(frozen=True, eq=False)
class Adapter:
    """The protocol over an implementation's own functions.

    The functions take the noise ``eps`` rather than a key (``loss_fn(state, batch, eps)``,
    ``train_step(state, batch, eps)``): the adapter draws ``eps = normal(key, (B, L))`` once, the
    same way for every framework. ``state.config`` must be the run's :class:`Config`.
    """

    name: str
    framework: str  # the distribution whose version the report headers print
    init_fn: Callable[[jax.Array, Config], Any]
    from_canonical_fn: Callable[[canonical.Canonical, Config], Any]
    to_canonical_fn: Callable[[Any], canonical.Canonical]
    loss_fn: Callable[[Any, Batch, jax.Array], tuple[jax.Array, Metrics]]
    train_step_fn: Callable[[Any, Batch, jax.Array], tuple[Any, Metrics]]
    encode_fn: Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
    decode_fn: Callable[[Any, jax.Array, jax.Array], jax.Array]
    # ``compute_grads(state, batch, eps) -> (grads, metrics)``: the step's first half, which the
    # per-device data-parallel steps of shared/spec/parallel.py run on each device's rows before
    # they average the gradients and call ``state.apply_gradients(grads)``. Optional: without it an
    # implementation runs serially and under sharded jit only.
    grads_fn: Callable[[Any, Batch, jax.Array], tuple[Any, Metrics]] | None = None
    # More than the protocol, each also an attribute of the adapter. ``extras["paths"]``: the
    # ``PATHS`` of the implementation's ``paths`` section, other ways to run the same train step
    # (``label -> make(state) -> (step, carry)``, ``step(carry, batch, key) -> (carry, metrics)``),
    # which the conformance suite checks against ``train_step`` and ``cvae bench`` times; empty
    # where the framework's idiomatic step is the fast path.
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)

    def init(self, key: jax.Array, config: Config) -> Any:
        return self.init_fn(key, _config(config))

    def from_canonical(self, params: canonical.Canonical, config: Config) -> Any:
        canonical.check(params, _config(config).model)
        return self.from_canonical_fn(_copy(params), config)

    def to_canonical(self, state: Any) -> canonical.Canonical:
        return _copy(self.to_canonical_fn(state))

    def loss(self, state: Any, batch: Batch, key: jax.Array) -> tuple[jax.Array, Metrics]:
        return self.loss_fn(state, batch, self._noise(state, batch, key))

    def train_step(self, state: Any, batch: Batch, key: jax.Array) -> tuple[Any, Metrics]:
        return self.train_step_fn(state, batch, self._noise(state, batch, key))

    def grads(self, state: Any, batch: Batch, key: jax.Array) -> tuple[Any, Metrics]:
        """``grads_fn`` on the noise :meth:`train_step` would draw for ``key``, after the same
        checks: the first half of the step, for the trainer's serial step to see the gradient."""
        return self.grads_fn(state, batch, self._noise(state, batch, key))

    def encode(self, state: Any, x: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
        model = state.config.model
        check_features(x, model.input_dim)
        check_labels(c, model.num_classes, rows=x.shape[0])
        return self.encode_fn(state, x, c)

    def decode(self, state: Any, z: jax.Array, c: jax.Array) -> jax.Array:
        model = state.config.model
        check_latent(z, model.latent_dim)
        check_labels(c, model.num_classes, rows=z.shape[0], of="z")
        return self.decode_fn(state, z, c)

    @staticmethod
    def _noise(state: Any, batch: Batch, key: jax.Array) -> jax.Array:
        model = state.config.model
        check_batch(batch, model.input_dim, model.num_classes)
        return noise(key, batch.x.shape[0], model.latent_dim)

    def __getattr__(self, name: str) -> Any:
        extras = self.__dict__.get("extras", {})
        if name in extras:
            return extras[name]
        raise AttributeError(f"implementation {self.__dict__.get('name')!r} has no {name!r}")

    def __repr__(self) -> str:
        return f"<implementation {self.name} ({self.framework})>"


# --- the loader -----------------------------------------------------------------------------------


# Which implementations are registered, and what each says of itself, is read without importing
# them by cvae_rosetta.spec.registry (which imports no JAX, for the docs build).


def known() -> list[ImplInfo]:
    """Every implementation known by name, installed or not, without importing any framework:
    :func:`cvae_rosetta.spec.registry.known`."""
    return registry.known()


def _registered() -> dict[str, str]:
    return registry.registered()


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _names_module(err: ModuleNotFoundError, module_name: str) -> bool:
    """Whether ``err`` is about ``module_name`` itself (or a package on its way), not about a
    module that one imports."""
    missing = err.name or ""
    return bool(missing) and (module_name == missing or module_name.startswith(missing + "."))


def _working_directory() -> str | None:
    """The current working directory, if it still exists and no entry of ``sys.path`` is it
    already (``""`` and ``"."`` are: ``python -m`` and ``python -c`` put them there)."""
    try:
        cwd = os.getcwd()
    except OSError:
        return None
    for entry in sys.path:
        try:
            if os.path.abspath(entry or os.curdir) == cwd:
                return None
        except (TypeError, ValueError):
            continue
    return cwd


def _import_module(module_name: str) -> Any:
    """``importlib.import_module``, looking in the working directory too when the module's
    top-level package is on no entry of ``sys.path``, as ``python -m`` would: the folder that
    holds ``mypackage`` is then appended to ``sys.path`` (last, so it never shadows what was
    importable) for the rest of the process, and left off again if the module is not there
    either."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        cwd = _working_directory()
        if cwd is None or err.name != module_name.partition(".")[0]:
            raise
    sys.path.append(cwd)
    importlib.invalidate_caches()
    try:
        return importlib.import_module(module_name)
    except BaseException:
        if cwd in sys.path:
            sys.path.remove(cwd)
        raise


def _import(spec: str, module_name: str) -> Any:
    """The module of an implementation; an error names which of three things went wrong: the
    module does not exist, it needs a module that is not installed, or importing it failed."""
    which = f" (the module of {spec!r})" if spec in _registered() else ""
    try:
        return _import_module(module_name)
    except ModuleNotFoundError as err:
        if _names_module(err, module_name):
            where = "on sys.path"
            if err.name == module_name.partition(".")[0]:
                with contextlib.suppress(OSError):
                    where += f" or in the working directory {os.getcwd()}"
            raise ImplementationNotFound(
                f"impl: expected an importable module {module_name!r}{which}, got no module "
                f"named {err.name!r} {where}"
            ) from err
        raise ImplementationNotFound(
            f"impl: expected module {module_name!r}{which} to import, got ModuleNotFoundError "
            f"inside it: it needs {err.name!r}, which is not installed"
        ) from err
    except ImportError as err:
        raise ImplementationNotFound(
            f"impl: expected module {module_name!r}{which} to import, got ImportError inside "
            f"it: {err}"
        ) from err


def load(spec: str) -> Implementation:
    """The implementation named ``spec``: a registered short name or ``"module:attribute"``."""
    if not isinstance(spec, str) or not spec:
        raise field_error(ImplementationNotFound, "impl", "a name or 'module:attribute'", spec)
    target = _registered().get(spec, spec)
    if ":" not in target:
        infos = known()
        listing = ", ".join(
            f"{i.name} ({'installed' if i.installed else 'not installed'})" for i in infos
        )
        raise ImplementationNotFound(
            f"impl: expected a known implementation or 'module:attribute', got {spec!r}; "
            f"known implementations: {listing}"
        )
    module_name, _, attribute = target.partition(":")
    module = _import(spec, module_name)
    obj: Any = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise ImplementationNotFound(
                f"impl: expected module {module_name!r} to define {attribute!r}, got a module "
                f"without {part!r} ({getattr(module, '__file__', None) or module_name})"
            )
        obj = getattr(obj, part)
    missing = [m for m in MEMBERS if not hasattr(obj, m)]
    if missing:
        raise ImplementationNotFound(
            f"impl: expected {target!r} to have the protocol members {', '.join(MEMBERS)}; "
            f"missing: {', '.join(missing)}"
        )
    return obj


def framework_of(impl: Any) -> tuple[str, str | None]:
    """``(distribution, version)`` of the framework behind ``impl``, for report headers."""
    distribution = getattr(impl, "framework", None) or type(impl).__module__.split(".")[0]
    return distribution, _version(distribution)
