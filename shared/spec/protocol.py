"""SPEC section 6: the protocol every implementation meets, its adapter, and the loader.

An implementation module writes its framework's own functions, then hands them to :class:`Adapter`
in its last section. The adapter is the only place that validates input (SPEC section 7) and draws
the noise of a call (SPEC section 3), so every implementation refuses the same bad input with the
same message and sees the same noise for the same key.

:func:`load` resolves an implementation from a short name registered under the entry-point group
``cvae_rosetta.impls`` or from any ``"module:attribute"`` string, one outside the repo included.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from cvae_rosetta.spec import canonical
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import ConfigError, ImplementationNotFound, field_error
from cvae_rosetta.spec.losses import Metrics
from cvae_rosetta.spec.model import noise
from cvae_rosetta.spec.validation import (
    Batch,
    check_batch,
    check_features,
    check_labels,
    check_latent,
)

ENTRY_POINT_GROUP = "cvae_rosetta.impls"
BUILTIN_PACKAGE = "cvae_rosetta.impls"  # entry points with a target in it are the built-in ones
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


def _copy(tree: Any) -> Any:
    """Fresh buffers, so that donating a state never invalidates the caller's parameter tree."""
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


@dataclasses.dataclass(frozen=True)
class Builtin:
    """One of this repository's implementations."""

    target: str  # "module:attribute", its entry point's value
    module: str  # the framework module that must be importable for it to be installed


# The framework module each built-in implementation needs, by entry-point name, in the order
# `cvae impls` lists them. The names and targets themselves are the `cvae_rosetta.impls` entry
# points of pyproject.toml; how to install a framework is the application's to say
# (cvae_rosetta.app.frameworks).
BUILTIN_FRAMEWORKS: dict[str, str] = {
    "pure_jax": "jax",
    "flax_linen": "flax",
    "flax_nnx": "flax",
    "haiku": "haiku",
    "equinox": "equinox",
}


def _builtin() -> dict[str, Builtin]:
    """The entry points with a target in :data:`BUILTIN_PACKAGE` (whether their frameworks are
    installed or not), with the module :data:`BUILTIN_FRAMEWORKS` says each needs; an entry point
    without a row there is listed like one registered from outside."""
    targets = {
        ep.name: ep.value
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        if ep.value.startswith(BUILTIN_PACKAGE + ".")
    }
    return {
        name: Builtin(targets[name], module)
        for name, module in BUILTIN_FRAMEWORKS.items()
        if name in targets
    }


BUILTIN: dict[str, Builtin] = _builtin()


@dataclasses.dataclass(frozen=True)
class ImplInfo:
    name: str
    target: str
    installed: bool
    module: str  # what must be importable: a built-in's framework, else its target's top package


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _registered() -> dict[str, str]:
    found = {name: b.target for name, b in BUILTIN.items()}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.value)
    return found


def known() -> list[ImplInfo]:
    """Every implementation known by name, installed or not, without importing any framework."""
    infos = []
    for name, target in _registered().items():
        # one registered from outside is installed if its top-level package can be found
        outside = target.split(":")[0].split(".")[0]
        module = BUILTIN[name].module if name in BUILTIN else outside
        infos.append(ImplInfo(name, target, importlib.util.find_spec(module) is not None, module))
    return infos


def _names_module(err: ModuleNotFoundError, module_name: str) -> bool:
    """Whether ``err`` is about ``module_name`` itself (or a package on its way), not about a
    module that one imports."""
    missing = err.name or ""
    return bool(missing) and (module_name == missing or module_name.startswith(missing + "."))


def _import(spec: str, module_name: str) -> Any:
    """The module of an implementation; an error names which of three things went wrong: the
    module does not exist, it needs a module that is not installed, or importing it failed."""
    which = f" (the module of {spec!r})" if spec in _registered() else ""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if _names_module(err, module_name):
            raise ImplementationNotFound(
                f"impl: expected an importable module {module_name!r}{which}, got no module "
                f"named {err.name!r} on sys.path"
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
