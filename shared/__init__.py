"""cvae-rosetta: one conditional VAE and one training step in pure JAX, Flax Linen, Flax NNX, Haiku,
Equinox and Keras 3, behind one protocol, held to one spec.

The layers, lowest first (each imports only the ones above it in this list):

- ``cvae_rosetta.spec``: the contract an implementation needs (model pieces, loss, optimiser,
  canonical parameters, config, validation, errors, train state, the protocol and its loader, the
  data-parallel wrappers the suite checks). It imports nothing else of the project.
- ``cvae_rosetta.files``: atomic writes that respect the umask, used by every writer (it imports
  nothing of the project).
- ``cvae_rosetta.impls``: one module per framework (spec only).
- ``cvae_rosetta.conformance``: the suite, a pytest plugin (spec and files only).
- ``cvae_rosetta.app``: the application: data, trainer, checkpoints, evaluation, inference, export,
  serving, pictures, the run directory, and :func:`cvae_rosetta.app.train.train_and_evaluate`.
- ``cvae_rosetta.bench``: the benchmark harness.
- ``cvae_rosetta.cli``: the ``cvae`` command, which only parses arguments; nothing imports it.
"""

__version__ = "0.1.0"

# What a user's environment is made of: JAX and its dtypes, the libraries every implementation
# uses, then each framework; what ``cvae --version`` prints and each tox environment records for
# docs/versions.md (docs_build/versions.py), in this order.
STACK = (
    *("jax", "jaxlib", "ml-dtypes", "numpy", "optax", "orbax-checkpoint", "chex"),
    *("flax", "dm-haiku", "equinox", "keras"),
)


def version_of(distribution: str) -> str | None:
    """The installed version of ``distribution`` (None: not installed), read from its metadata."""
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_versions() -> dict[str, str | None]:
    """Python's version, then every distribution's of :data:`STACK` (None: not installed), read
    from their metadata: nothing is imported, so JAX does not start."""
    import platform

    return {"python": platform.python_version(), **{name: version_of(name) for name in STACK}}
