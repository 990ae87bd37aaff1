"""Sections memory and memory_101m: what each twin x strategy holds per device in its compiled
train step, from XLA's memory_analysis() (compile only: nothing runs), beside the formula
(shard_parity/memory.py).

    python -m benchmarks.run --sections=memory --cpu_devices=8
    python -m benchmarks.run --sections=memory_101m --target=tpu-v5e-8

`--target`: compiled for that hardware instead of the emulated CPU devices (inspector/target.py;
pip install -e ".[tpu]"). A TPU's temp_size_in_bytes is not its peak (it can be 0 where the
peak is megabytes): the rows then also carry the TPU compiler's own peak_memory_in_bytes, the
arguments and live buffers at their largest, which is what the chip's HBM must hold.

memory: dp and fsdp on 8x1, tp and fsdp_tp on 4x2; a transformer of width 512 (one layer 12 MiB of
float32) at 2 and 4 layers, global batch 8. The formula: the gradient each device holds (all
of it under dp, 1/m under tp, 1/n under fsdp and fsdp_tp) + the weights gathered at a time
(one layer under fsdp, 1/m of one under fsdp_tp) + each layer's input x [B/d, T, C].
memory_101m: the README's headline, the 101M-parameter transformer (8 layers, width 1024) under
dp and fsdp on 8x1 and fsdp_tp on 4x2, global batch 8, in the three twins.
"""

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from shard_parity import auto, explicit, memory, typed
from shard_parity import plan as plans
from shard_parity.inspector import target as targets
from shard_parity.mesh import FSDP, MODEL, mesh_for
from shard_parity.model.transformer import Transformer
from shard_parity.placement import rows
from shard_parity import config as cfg
from shard_parity.runtime.tasks import lm_loss
from shard_parity.step import make_optimizer, strategy_file

CONFIG = cfg.TransformerConfig(seq_len=32, num_layers=2, num_heads=8, num_kv_heads=8, embed_dim=512)
SHAPES = {'dp': '8x1', 'fsdp': '8x1', 'tp': '4x2', 'fsdp_tp': '4x2'}  # fsdp_tp: fsdp:4,model:2
LAYERS = (2, 4)
BATCH_SIZE = 8
# the README's 101M-parameter transformer (385 MiB of float32; one layer 48 MiB)
HEADLINE = cfg.TransformerConfig(seq_len=32, num_layers=8, num_heads=8, num_kv_heads=8, embed_dim=1024)


def formula(model_config, plan) -> dict:
    terms = memory.expected(model_config, plan, BATCH_SIZE)
    # under fsdp one layer gathered at a time (its 'model' share of it under fsdp_tp)
    terms['gathered'] = terms['layer'] / plan.size(MODEL) if plan.uses(FSDP) else 0.0
    terms['formula'] = terms['params_n'] + terms['gathered'] + terms['activations']
    return terms


def one(twin, strategy: str, model_config, target: str | None = None) -> dict:
    devices = targets.devices(target) if target else None
    plan = plans.parse(SHAPES[strategy], strategy, 8)
    mesh = mesh_for(plan, twin.AXIS_TYPE, devices=devices)
    sharding = NamedSharding(mesh, rows(plan))
    shape = (BATCH_SIZE, model_config.seq_len)
    batch = {k: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding) for k in ('x', 'y')}
    expected = formula(model_config, plan)
    try:
        with targets.uncached(target is not None):
            compiled = memory.compiled_step(
                strategy_file(twin, plan),
                lambda rngs: Transformer(model_config, rngs=rngs),
                lm_loss,
                make_optimizer(cfg.TrainConfig()),
                mesh,
                plan,
                batch,
            )
    except Exception as e:  # a target's HBM that cannot hold it: the compiler's reason
        if not target or (why := targets.does_not_fit(e)) is None:
            raise
        return {'does_not_fit': why, 'target': target, **expected}
    out = memory.measured(compiled)
    if target:
        peak = compiled.memory_analysis().peak_memory_in_bytes
        out |= {'target': target, 'compiler_peak': peak / memory.MiB}
    return {**out, **expected}


def memory_section(layers=LAYERS, model_config=CONFIG, target: str | None = None) -> list[dict]:
    """One row per twin x strategy x layer count, in MiB per device."""
    rows = []
    for strategy in SHAPES:
        for twin in (auto, explicit, typed):
            for n in layers:
                mc = dataclasses.replace(model_config, num_layers=n)
                row = {'twin': twin.NAME, 'strategy': strategy, 'layers': n}
                rows.append(row | one(twin, strategy, mc, target))
    return rows


def headline(target: str | None = None) -> list[dict]:
    """memory_101m: the 101M-parameter transformer under dp, fsdp and fsdp_tp, one row per twin."""
    return [
        {'twin': twin.NAME, 'strategy': strategy, 'layers': HEADLINE.num_layers}
        | one(twin, strategy, HEADLINE, target)
        for strategy in ('dp', 'fsdp', 'fsdp_tp')
        for twin in (auto, explicit, typed)
    ]


def _cells(r: dict, keys) -> str:
    if 'does_not_fit' in r:  # not compiled: the measured cells are the compiler's reason
        return ' | '.join('does not fit' if k in MEASURED else f'{r[k]:.1f}' for k in keys)
    return ' | '.join(f'{r[k]:.1f}' for k in keys)


MEASURED = ('arguments', 'temp', 'peak', 'compiler_peak')


def markdown(rows: list[dict], title: str = '', config=CONFIG) -> list[str]:
    target = next((r['target'] for r in rows if r.get('target')), None)
    where = f'compiled for {target}' if target else 'XLA:CPU, 8 emulated devices'
    out = [
        f'\n## {title or "Memory per device of the compiled train step"} (MiB, XLA '
        f'memory_analysis, {where})\n',
        (
            f'Transformer of width {config.embed_dim}, {config.num_heads} heads, seq_len '
            f'{config.seq_len}, global batch {BATCH_SIZE}; '
            + ', '.join(f'{k} on {SHAPES[k]}' for k in dict.fromkeys(r['strategy'] for r in rows))
            + '. formula = gradient held (params/n) + gathered weights + layer inputs. peak = '
            'arguments + temp + outputs - aliased'
            + (
                "; TPU peak: the TPU compiler's own peak_memory_in_bytes (its temp is not the "
                'peak).\n'
                if target else '.\n'
            )
        ),
    ]  # fmt: skip
    keys = ('arguments', 'temp', 'peak') + (('compiler_peak',) if target else ())
    keys += ('params_n', 'gathered', 'activations', 'formula')
    head = ['twin', 'strategy', 'layers', 'arguments', 'temp', 'peak']
    head += ['TPU peak'] if target else []
    head += ['params/n', 'gathered', 'activations', 'formula']
    out += ['| ' + ' | '.join(head) + ' |', '| --- | --- |' + ' ---: |' * (len(head) - 2)]
    for r in rows:
        out.append(f"| {r['twin']} | {r['strategy']} | {r['layers']} | {_cells(r, keys)} |")
    out += [f"\n{r['twin']} {r['strategy']}: {r['does_not_fit']}" for r in rows if 'does_not_fit' in r]
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
            [r['layers'] for r in mine],
            [r.get('temp', float('nan')) for r in mine],  # nan: did not fit the target
            marker='o',
            label='/'.join(key),
        )
    ax.set(
        xlabel='layers', ylabel='temp MiB per device', title='Compiled train step: temp vs layers'
    )
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / f'memory{suffix}.png', dpi=90)
    plt.close(fig)
