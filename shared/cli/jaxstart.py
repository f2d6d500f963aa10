"""JAX's start-up: the platform (``--platform``) and the persistent compilation cache
(``--compilation-cache``), checked with the other arguments and set before JAX starts, then JAX
started before a command's first compilation; JAX's refusal of a platform as one line.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cvae_rosetta.app import cache, signals
from cvae_rosetta.spec.errors import ConfigError, field_error

PLATFORMS = ("cpu", "gpu", "tpu")


def add_jax_flags(parser: argparse.ArgumentParser, *, cache_default: bool = True) -> None:
    where = f"[{cache.default_folder()}]" if cache_default else "[none: bench measures compiling]"
    group = parser.add_argument_group("JAX")
    group.add_argument(
        "--platform",
        default=None,
        metavar="{" + ",".join(PLATFORMS) + "}",
        help="the platform JAX runs on (sets JAX_PLATFORMS) [JAX's choice]",
    )
    choice = group.add_mutually_exclusive_group()
    choice.add_argument(
        "--compilation-cache",
        default=None,
        metavar="DIR",
        help=f"JAX's persistent compilation cache: compiled programs are kept in DIR and read "
        f"back by the next run that compiles them ('off': none; also "
        f"${cache.ENV}=DIR or off) {where}",
    )
    choice.add_argument(
        "--no-compilation-cache", action="store_true", help="no persistent compilation cache"
    )


def start_jax(args: argparse.Namespace, *, cache_default: bool = True) -> None:
    """The platform and the compilation cache, once every argument is checked and before the
    command's first compilation (this imports JAX and the application's modules). A SIGINT or
    SIGTERM meanwhile ends the process at once in one line: nothing is written yet, and a stop
    raised inside a native import could not end as cleanly."""
    with signals.ends_at_once("starting", after="nothing written; run the same command"):
        _start_jax_now(args, cache_default=cache_default)
        import cvae_rosetta.app.train  # noqa: F401  (JAX, Optax, the run's modules)


def _start_jax_now(args: argparse.Namespace, *, cache_default: bool) -> None:
    import os

    platform = getattr(args, "platform", None)
    choice = cache.choose(
        getattr(args, "compilation_cache", None),
        off=getattr(args, "no_compilation_cache", False),
        default_on=cache_default,
    )
    if platform is not None:
        os.environ["JAX_PLATFORMS"] = _jax_platform(platform)  # read when JAX starts
        import jax

        jax.config.update("jax_platforms", os.environ["JAX_PLATFORMS"])  # where it started
        if platform != "cpu" and not getattr(args, "distributed", False):
            _probe_platform(jax, platform)
    _, warning = cache.use(choice)
    if warning:
        print(f"cvae: warning: {warning}", file=sys.stderr)


def _jax_platform(platform: str) -> str:
    """``JAX_PLATFORMS`` for ``--platform``: ``gpu`` is the GPU platform whose JAX plugin is
    installed (``cuda``, else ``rocm``; JAX's own alias ``gpu`` asks for every one of them)."""
    if platform != "gpu":
        return platform
    import importlib.util
    import pkgutil
    from importlib import metadata

    names = {entry.name for entry in metadata.entry_points(group="jax_plugins")}
    spec = importlib.util.find_spec("jax_plugins")
    if spec is not None and spec.submodule_search_locations:
        names |= {m.name for m in pkgutil.iter_modules(spec.submodule_search_locations)}
    cuda, rocm = (any(kind in name for name in names) for kind in ("cuda", "rocm"))
    return "rocm" if rocm and not cuda else "cuda"


def _probe_platform(jax: Any, platform: str) -> None:
    """Start JAX's backend now, so that a platform it cannot use is refused before anything is
    written (a CPU needs no probe; a run of several processes joins its cluster first)."""
    try:
        jax.devices()
    except Exception as err:  # RuntimeError, or a bare AssertionError for CUDA without a GPU
        text = " ".join(str(err).split()).split(" (set JAX_PLATFORMS=")[0]
        raise field_error(
            ConfigError,
            "platform",
            f"a platform JAX can use on this machine ({text or f'no {platform} device found'})",
            platform,
        ) from None


def check_jax_flags(args: argparse.Namespace) -> None:
    platform = getattr(args, "platform", None)
    if platform is not None and platform not in PLATFORMS:
        raise field_error(ConfigError, "platform", f"one of {', '.join(PLATFORMS)}", platform)
    cache.choose(getattr(args, "compilation_cache", None))  # refuses an empty DIR


def platform_unavailable(err: RuntimeError, args: argparse.Namespace) -> str | None:
    """JAX's refusal of ``--platform`` (no such device or plugin here) as one line, else None."""
    platform = getattr(args, "platform", None)
    text = " ".join(str(err).split())
    if platform is None or "backend" not in text.lower():
        return None
    text = text.split(" (set JAX_PLATFORMS=")[0]
    return f"--platform: expected a platform JAX can use on this machine, got {platform!r} ({text})"
