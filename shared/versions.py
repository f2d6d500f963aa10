"""The versions of what a user's environment is made of, read from the installed distributions'
metadata (nothing imported, so ``cvae --version`` answers without starting JAX): what ``cvae
--version`` prints, and what each tox environment records for docs/versions.md.
"""

from __future__ import annotations

import importlib.metadata
import platform

# JAX and its dtypes, the libraries every implementation uses, then each framework: the order
# ``cvae --version`` and docs/versions.md give them in.
STACK = (
    *("jax", "jaxlib", "ml-dtypes", "numpy", "optax", "orbax-checkpoint", "chex"),
    *("flax", "dm-haiku", "equinox", "keras"),
)


def version(distribution: str) -> str | None:
    """The installed version of ``distribution``, None where it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed() -> dict[str, str | None]:
    """Python's version, then every distribution's of :data:`STACK` (None: not installed)."""
    return {"python": platform.python_version(), **{name: version(name) for name in STACK}}
