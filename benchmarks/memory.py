"""Section memory: what each twin x strategy holds per device in its compiled train step, from
XLA's memory_analysis() (compile only: nothing runs), beside the formula (shard_parity/memory.py).

    python -m benchmarks.run --sections=memory --cpu_devices=8

dp and fsdp on 8x1, tp and fsdp_tp on 4x2; a transformer of width 512 (one layer 12 MiB of
float32) at 2 and 4 layers, global batch 8. The formula: the gradient each device holds (all
of it under dp, 1/m under tp, 1/n under fsdp and fsdp_tp) + the weights gathered at a time
(one layer under fsdp, 1/m of one under fsdp_tp) + each layer's input x [B/d, T, C].
"""

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from shard_parity import auto, explicit, memory, typed
from shard_parity import plan as plans
from shard_parity.mesh import MODEL, mesh_for
from shard_parity.model.transformer import Transformer
from shard_parity.placement import rows
from shard_parity.runtime import config as cfg
from shard_parity.runtime.tasks import lm_loss
from shard_parity.step import make_optimizer

CONFIG = cfg.TransformerConfig(seq_len=32, num_layers=2, num_heads=8, num_kv_heads=8, embed_dim=512)
SHAPES = {'dp': '8x1', 'fsdp': '8x1', 'tp': '4x2', 'fsdp_tp': '4x2'}  # fsdp_tp: fsdp:4,model:2
LAYERS = (2, 4)
BATCH_SIZE = 8


def formula(model_config, strategy: str, mesh) -> dict:
    terms = memory.expected(model_config, strategy, mesh, BATCH_SIZE)
    gathered = {'fsdp': terms['layer'], 'fsdp_tp': terms['layer'] / mesh.shape[MODEL]}
    terms['gathered'] = gathered.get(strategy, 0.0)
    terms['formula'] = terms['params_n'] + terms['gathered'] + terms['activations']
    return terms


def one(twin, strategy: str, model_config) -> dict:
    mesh = mesh_for(plans.parse(SHAPES[strategy], strategy, 8), twin.AXIS_TYPE)
    sharding = NamedSharding(mesh, rows(mesh, strategy))
    shape = (BATCH_SIZE, model_config.seq_len)
    batch = {k: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding) for k in ('x', 'y')}
    compiled = memory.compiled_step(
        twin.STRATEGIES[strategy],
        lambda rngs: Transformer(model_config, rngs=rngs),
        lm_loss,
        make_optimizer(cfg.TrainConfig()),
        mesh,
        batch,
    )
    return {**memory.measured(compiled), **formula(model_config, strategy, mesh)}


def memory_section(layers=LAYERS, model_config=CONFIG) -> list[dict]:
    """One row per twin x strategy x layer count, in MiB per device."""
    rows = []
    for strategy in SHAPES:
        for twin in (auto, explicit, typed):
            for n in layers:
                mc = dataclasses.replace(model_config, num_layers=n)
                row = {'twin': twin.NAME, 'strategy': strategy, 'layers': n}
                rows.append(row | one(twin, strategy, mc))
    return rows


def markdown(rows: list[dict]) -> list[str]:
    out = [
        '\n## Memory per device of the compiled train step (MiB, XLA memory_analysis)\n',
        (
            f'Transformer of width {CONFIG.embed_dim}, {CONFIG.num_heads} heads, seq_len '
            f'{CONFIG.seq_len}, global batch {BATCH_SIZE}; dp and fsdp on 8x1, tp and fsdp_tp on '
            '4x2. formula = gradient held (params/n) + gathered weights + layer inputs.\n'
        ),
        (
            '| twin | strategy | layers | arguments | temp | peak | params/n | gathered '
            '| activations | formula |'
        ),
        '| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
    ]
    keys = ('arguments', 'temp', 'peak', 'params_n', 'gathered', 'activations', 'formula')
    for r in rows:
        cells = ' | '.join(f'{r[k]:.1f}' for k in keys)
        out.append(f"| {r['twin']} | {r['strategy']} | {r['layers']} | {cells} |")
    return out


def plot(rows: list[dict], out: pathlib.Path, suffix: str = '') -> None:
    """memory.png: temp against layers, one line per twin x strategy."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key in sorted({(r['twin'], r['strategy']) for r in rows}):
        mine = [r for r in rows if (r['twin'], r['strategy']) == key]
        ax.plot(
            [r['layers'] for r in mine], [r['temp'] for r in mine], marker='o', label='/'.join(key)
        )
    ax.set(
        xlabel='layers', ylabel='temp MiB per device', title='Compiled train step: temp vs layers'
    )
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / f'memory{suffix}.png', dpi=90)
    plt.close(fig)
