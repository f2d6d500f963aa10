"""A train state for implementations whose parameters are a plain pytree (pure JAX, Haiku).

Arrays (step, parameters, optimiser state) are pytree leaves; the config and the optax
transformation are static metadata, as in Flax's ``TrainState``. A state can therefore be jitted,
donated, sharded and checkpointed like any pytree, and every call needs nothing but the state.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.optim import make_optimizer


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    step: jax.Array
    params: Any
    opt_state: optax.OptState
    config: Config = dataclasses.field(metadata=dict(static=True))
    tx: optax.GradientTransformation = dataclasses.field(metadata=dict(static=True))

    @classmethod
    def create(cls, params: Any, config: Config) -> TrainState:
        """Step 0, fresh optimiser state from the shared optimiser of ``config.optim``."""
        tx = make_optimizer(config.optim)
        return cls(jnp.zeros((), jnp.int32), params, tx.init(params), config, tx)

    def apply_gradients(self, grads: Any) -> TrainState:
        """One optax update; returns the new state."""
        updates, opt_state = self.tx.update(grads, self.opt_state, self.params)
        params = optax.apply_updates(self.params, updates)
        return dataclasses.replace(self, step=self.step + 1, params=params, opt_state=opt_state)

    def replace(self, **changes: Any) -> TrainState:
        return dataclasses.replace(self, **changes)
