"""What a compiled train step holds per device, from XLA's own `memory_analysis()`, beside the
formula it should follow. Compile-time figures: deterministic, no step is run.

    arguments  the state and batch each device holds on entry (params/n under FSDP)
    temp       XLA's scratch during the step: gradients, gathered weights, activations
    peak       arguments + temp + outputs, less the outputs that reuse donated arguments
               (XLA:CPU's own peak_memory_in_bytes counts the arguments only)

The formula's terms (`expected`), per device, in bytes of float32:

    params_n     all the parameters / the devices that split them (n = the product of the
                 plan's fsdp, model and stage sizes: the mesh's size under fsdp and fsdp_tp;
                 the 'model' axis size under tp; 1 under dp)
    layer        one block's parameters, whole: what FSDP gathers at a time
    activations  each layer's input x [B/d, T, C], kept for the backward by the scan's
                 checkpoint (B/d: this device's rows)

FSDP's temp: its gradient shards (params_n) + one layer gathered and that layer's whole
gradient before the reduce-scatter (2 x layer, at most) + activations; per added layer:
layer / n + one layer's input. dp's and tp's temp hold the whole (or 1/m) gradient.
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from shard_parity.plan import FSDP, MODEL, STAGE
from shard_parity.placement import state_shardings, state_specs
from shard_parity.step import TrainState

MiB = 2**20


def abstract_state(make_model, tx, mesh, plan):
    """(graphdef, TrainState of ShapeDtypeStructs placed as `plan` places them): no array is
    made, so the issue's 101M-parameter model compiles without being initialised."""
    graphdef, params = nnx.split(nnx.eval_shape(lambda: make_model(nnx.Rngs(0))))
    state = TrainState(jax.ShapeDtypeStruct((), jnp.int32), params, jax.eval_shape(tx.init, params))
    return graphdef, jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        state,
        state_shardings(state, mesh, plan),
    )


def compiled_step(module, make_model, loss_fn, tx, mesh, plan, batch: dict):
    """`module.train_step` (the twin's file that runs `plan`: step.strategy_file), lowered and
    compiled for `batch` (a dict of ShapeDtypeStructs with their shardings); nothing runs."""
    graphdef, state = abstract_state(make_model, tx, mesh, plan)
    return module.train_step(graphdef, loss_fn, tx, mesh, plan).lower(state, batch).compile()


def state_bytes(state, mesh, plan) -> int:
    """Each device's bytes of `state` (arrays or ShapeDtypeStructs): every array's whole bytes
    / the product of the sizes of the mesh axes its layout splits it over (placement.spec, one
    rule per axis). What memory_analysis() counts of the state among a step's arguments."""
    total = 0
    for x, spec in zip(jax.tree.leaves(state), jax.tree.leaves(state_specs(state, plan, mesh)),
                       strict=True):  # fmt: skip
        axes = [a for d in spec if d for a in (d if isinstance(d, tuple) else (d,))]
        total += math.prod(x.shape) * x.dtype.itemsize // math.prod(plan.size(a) for a in axes)
    return total


def measured(compiled) -> dict:
    """Per-device arguments, temp and peak of a compiled program, in MiB."""
    m = compiled.memory_analysis()
    peak = (
        m.argument_size_in_bytes
        + m.temp_size_in_bytes
        + m.output_size_in_bytes
        - m.alias_size_in_bytes
    )
    return {
        'arguments': m.argument_size_in_bytes / MiB,
        'temp': m.temp_size_in_bytes / MiB,
        'peak': peak / MiB,
    }


def expected(model_config, plan, batch_size: int) -> dict:
    """The formula's terms for a transformer (module docstring), per device, in MiB: the
    parameters split over the axes that split them (placement.py's rules)."""
    c, n_layers = model_config.embed_dim, model_config.num_layers
    kv = 2 * model_config.num_kv_heads * model_config.head_dim
    layer = 4 * (c * c + c * kv + c * c + 8 * c * c + 2 * c)  # q, kv, out, up+down, 2 norms
    outside = 4 * (model_config.vocab_size * c + model_config.seq_len * c + c)
    split = math.prod(plan.size(a) for a in (FSDP, MODEL, STAGE))
    rows = batch_size // math.prod(plan.size(a) for a in plan.rows)
    return {
        'params_n': (n_layers * layer + outside) / split / MiB,
        'layer': layer / MiB,
        'activations': 4 * n_layers * rows * model_config.seq_len * c / MiB,
    }
