"""What a run needs of the machine, checked before anything is allocated or started: the memory a
config's model takes to train, and the processes a launch starts. Nothing here imports JAX, so the
CLI refuses a config that cannot fit (``--latent-dim 100000000``) in one line, at once.
"""

from __future__ import annotations

import os
from typing import Any

from cvae_rosetta.spec.canonical import layer_sizes
from cvae_rosetta.spec.errors import ConfigError

# float32 copies of the parameters a step holds at once: the parameters, their gradient, Adam's two
# moments, and the update's new parameters before the old ones are given back
STATE_COPIES = 5
# float32 values per unit of each layer's width kept for a step: the forward activation, its
# gradient, and the pre-activation the ReLU's gradient reads
ACTIVATION_COPIES = 3
# what one process of a launch takes before its model (Python, JAX and XLA's runtime, compiled
# programs): 300 to 400 MB measured on a CPU
PROCESS_BYTES = 400 * 2**20
STEP_LIMIT = 2**31 - 1  # the step counter is a 32-bit integer (optax's count, the checkpoints')


def available_memory() -> int | None:
    """Bytes the machine can give a new allocation now (``MemAvailable``), None if unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the system says, else all)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def gigabytes(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n < 1e12 else f"{n / 1e12:,.1f} TB"


def _layers(model: Any) -> list[tuple[str, int, int]]:
    """``(the config field that sizes it, fan_in, fan_out)`` of every dense layer (the decoder's
    takes the latent as input, so the latent size sizes it too)."""
    sizes = layer_sizes(model)
    first, *rest = sizes["decoder"]
    return [
        *(("model.encoder_dims", a, b) for a, b in sizes["encoder"]),
        *(("model.latent_dim", a, b) for a, b in (*sizes["latent"], first)),
        *(("model.decoder_dims", a, b) for a, b in rest),
    ]


def training_bytes(config: Any) -> tuple[int, str]:
    """The memory a step of ``config`` holds at its peak, estimated from the model's sizes and
    the batch (the parameters and optimiser state on every device, the activations of the
    batch), and the config field whose value makes most of it (the CLI shows it as the flag
    that set it)."""
    layers = _layers(config.model)
    params = sum((a + 1) * b for _, a, b in layers)
    state = 4 * STATE_COPIES * params * config.train.devices
    widths = sum(b for _, _, b in layers) + layers[0][1]
    activations = 4 * ACTIVATION_COPIES * config.data.batch_size * widths
    if activations > state:
        return state + activations, "data.batch_size"
    largest = max(layers, key=lambda layer: (layer[1] + 1) * layer[2])
    return state + activations, largest[0]


def check_fits(config: Any) -> None:
    """Refuse, before anything is allocated, a config whose training cannot fit the memory this
    machine has available."""
    need, field = training_bytes(config)
    have = available_memory()
    if have is not None and need > have:
        raise ConfigError(
            f"{field}: expected a run that fits this machine's {gigabytes(have)} of available "
            f"memory, got one that needs about {gigabytes(need)} to train (its parameters, "
            f"gradient and Adam's moments, and the batch's activations)"
        )


def check_steps(epochs: int, steps_per_epoch: int) -> None:
    """Refuse a run whose last step the 32-bit step counter cannot count."""
    if epochs * steps_per_epoch > STEP_LIMIT:
        raise ConfigError(
            f"train.epochs: expected at most {STEP_LIMIT // steps_per_epoch:,} (the step counter "
            f"is a 32-bit integer: {STEP_LIMIT:,} steps of which an epoch here is "
            f"{steps_per_epoch:,}), got {epochs:,}"
        )


def check_launch(num_processes: int, *, oversubscribe: bool = False) -> None:
    """Refuse more processes than this machine can run at once (a core each, and
    :data:`PROCESS_BYTES` of memory each), unless ``oversubscribe``."""
    if oversubscribe:
        return
    cores, have = usable_cores(), available_memory()
    fit = cores if have is None else min(cores, max(1, have // PROCESS_BYTES))
    if num_processes > fit:
        memory = "" if have is None else f" and {gigabytes(have)} of available memory"
        raise ConfigError(
            f"--num-processes: expected at most {fit} (this machine's {cores} usable "
            f"core{'s' if cores != 1 else ''}{memory}: each process takes a core and about "
            f"{PROCESS_BYTES // 2**20} MB), got {num_processes}; --oversubscribe starts more "
            "anyway"
        )
