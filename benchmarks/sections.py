"""The parallel measurements of `python -m benchmarks.run`: sections 1 (the twins), 2 (the device
sweep) and 6 (the strategies), one function each, and the setup every section shares. The
one-device sections (3-5) are in benchmarks/one_device.py; context, memory and cli have modules
of their own.

Every section builds synthetic batches (speed does not depend on the data) and random weights,
and times its candidates side by side with benchmarks.timing.interleaved.
"""

import jax
import numpy as np
from flax import nnx

from benchmarks.timing import interleaved
from shard_parity import auto, explicit, typed
from shard_parity import plan as plans
from shard_parity.mesh import mesh_for
from shard_parity.model.mlp import MLP
from shard_parity.model.transformer import Transformer
from shard_parity.placement import place_batch, place_state
from shard_parity.step import strategy_file
from shard_parity import config as cfg
from shard_parity.runtime import flops, tasks
from shard_parity.step import create_state, make_optimizer, one_device_train_step

NANOGPT = cfg.TransformerConfig()  # 4 layers, 4 heads, embed 128, seq_len 64
TWINS = (auto, explicit, typed)


def setup(model: str, batch_size: int, model_config=NANOGPT, seed=0):
    """(graphdef, tx, host state, loss, host batch, units per batch) for one model."""
    rng = np.random.default_rng(seed)
    if model == 'mlp':
        config, make = cfg.TRAIN_DEFAULTS['mlp'], lambda r: MLP(cfg.MLPConfig(), rngs=r)
        batch = {
            'image': rng.normal(size=(batch_size, 784)).astype(np.float32),
            'label': rng.integers(0, 10, batch_size).astype(np.int32),
        }
        loss, units = tasks.classification_loss, batch_size
    else:
        config, make = (
            cfg.TRAIN_DEFAULTS['transformer'],
            lambda r: Transformer(model_config, rngs=r),
        )
        x = rng.integers(0, 256, (batch_size, model_config.seq_len + 1)).astype(np.int32)
        batch, loss = {'x': x[:, :-1], 'y': x[:, 1:]}, tasks.lm_loss
        units = batch_size * model_config.seq_len
    tx = make_optimizer(config)
    graphdef, state = create_state(make(nnx.Rngs(seed)), tx)
    return graphdef, tx, jax.tree.map(np.array, state), loss, batch, units


def runner(
    twin,
    n: int | None,
    model: str,
    batch_size: int,
    steps=5,
    model_config=NANOGPT,
    mesh=None,
    strategy=None,
):
    """A callable running `steps` train steps of `twin` (None: the one-device run) on `mesh`,
    --mesh's text: named axes (data:2,fsdp:2,model:2), or AxB with `strategy`; by default dp on
    the first n devices. Each step waits on the previous one, as the training loop does."""
    graphdef, tx, state, loss, batch, units = setup(model, batch_size, model_config)
    if twin is None:
        step, placed = one_device_train_step(graphdef, loss, tx), jax.device_put(state)
        batch = jax.device_put(batch)
    else:
        plan = mesh_plan(mesh, strategy, n)
        on = mesh_for(plan, twin.AXIS_TYPE)  # typed/: Explicit
        step = strategy_file(twin, plan).train_step(graphdef, loss, tx, on, plan)
        placed, batch = place_state(state, on, plan), place_batch(batch, on, plan)
    box = [placed]

    def run():
        previous = None
        for _ in range(steps):
            box[0], metrics = step(box[0], batch)
            if previous is not None:
                jax.block_until_ready(previous)
            previous = metrics
        jax.block_until_ready(box[0])

    run.units, run.steps = units * steps, steps
    # XLA's count of the compiled step (already compiled by then: looked up, not compiled again)
    run.hardware_flops = lambda: flops.hardware_flops(step, box[0], batch)
    run.device0_bytes = sum(  # the state held by the first device: what FSDP divides
        sh.data.nbytes
        for x in jax.tree.leaves(box[0])
        for sh in x.addressable_shards
        if sh.device == jax.devices()[0]
    )
    return run


def mesh_plan(mesh: str | None, strategy: str | None = None, n: int | None = None) -> plans.Plan:
    """--mesh (and --strategy) over n devices (default all), as the train CLI reads them
    (shard_parity/plan.py): named axes, or AxB naming `strategy`'s two axes; none: dp on n."""
    return plans.parse(mesh, strategy or (None if mesh else 'dp'), n or jax.device_count())


def seq(model: str, model_config) -> int:
    """Units per example: the transformer's tokens (seq_len), the MLP's 1."""
    return 1 if model == 'mlp' else model_config.seq_len


def per_step(medians, runs):
    return {k: medians[k] / runs[k].steps for k in runs}


def flop_rates(model: str, model_config, units: float, seconds: dict, devices: int = 1) -> dict:
    """Each candidate's achieved model TFLOP/s and MFU (`NAME_model_tflops_per_sec`, `NAME_mfu`;
    runtime/flops.py: PaLM's count, the peak of `devices` devices in the compute dtype, None
    without one) for a step of `units` examples or tokens taking `seconds[NAME]`."""
    per = flops.per_unit(model, model_config) * units
    dtype = 'float32' if model == 'mlp' else model_config.dtype
    out = {}
    for name, s in seconds.items():
        r = flops.rates(per, s, jax.devices()[0], dtype, devices)
        key = f'{name}_' if name else ''
        out |= {f'{key}model_tflops_per_sec': r['model_tflops_per_sec'], f'{key}mfu': r['mfu']}
    return out


TWIN_RUNS = ('auto', 'explicit', 'typed', 'auto_copy')  # section 1's candidates on n devices


def twins(n: int, rounds: int, model_config=NANOGPT) -> list[dict]:
    """1. Step time of auto vs explicit vs typed (n devices) vs the one-device run, both models.

    `auto_copy` is the control: auto again, compiled and placed a second time, timed beside the
    others. Its ratio to auto compares the same program with itself, so it shows how precisely
    this process measures; explicit/auto means something only where it is further from 1."""
    rows = []
    for model, b in (('mlp', 128), ('transformer', 16)):
        runs = {
            'reference': runner(None, 1, model, b, model_config=model_config),
            'auto': runner(auto, n, model, b, model_config=model_config),
            'explicit': runner(explicit, n, model, b, model_config=model_config),
            'typed': runner(typed, n, model, b, model_config=model_config),
            'auto_copy': runner(auto, n, model, b, model_config=model_config),
        }
        t = per_step(interleaved(runs, rounds), runs)
        units = runs['auto'].units / runs['auto'].steps
        rows.append(
            {
                'model': model,
                'batch': b,
                'devices': n,
                **{f'{k}_ms': 1e3 * v for k, v in t.items()},
                'explicit_over_auto': t['explicit'] / t['auto'],
                'typed_over_auto': t['typed'] / t['auto'],
                'auto_copy_over_auto': t['auto_copy'] / t['auto'],
                **{f'{k}_per_sec': units / v for k, v in t.items()},
                **flop_rates(model, model_config, units, {'reference': t['reference']}),
                **flop_rates(model, model_config, units, {k: t[k] for k in TWIN_RUNS}, n),
            }
        )
    return rows


# Each strategy with its model-axis size; the first axis takes whatever that leaves of n devices.
STRATEGY_MODEL_AXES = [('dp', 1), ('fsdp', 1), ('tp', 2), ('tp', 4), ('fsdp_tp', 2)]


def strategy_meshes(n: int, named=()) -> list[tuple[str | None, str]]:
    """Section 6's (--strategy, --mesh) pairs: each strategy's AxB, then each of `named`
    (benchmarks.run --mesh=data:2,fsdp:2,model:2), whose axes say what runs."""
    out = [(s, f'{n // m}x{m}') for s, m in STRATEGY_MODEL_AXES if m <= n]
    return out + [(None, text) for text in named]


def strategies(n: int, rounds: int, model_config=NANOGPT, meshes=()) -> list[dict]:
    """6. Every strategy in every twin, and the named `meshes`: step time beside the state each
    device holds."""
    rows = []
    for model, b in (('mlp', 128), ('transformer', 16)):
        runs = {}
        for strategy, text in strategy_meshes(n, meshes):
            plan = mesh_plan(text, strategy, n)  # its rows name the mesh: data:4,model:2
            for twin in TWINS:
                runs[plan.strategy, plan.text(), twin.NAME] = runner(
                    twin, n, model, b, model_config=model_config, mesh=text, strategy=strategy
                )
        t = per_step(interleaved(runs, rounds), runs)
        for (strategy, mesh, twin), v in t.items():
            rows.append(
                {
                    'model': model,
                    'strategy': strategy,
                    'mesh': mesh,
                    'twin': twin,
                    'step_ms': 1e3 * v,
                    'state_bytes_per_device': runs[strategy, mesh, twin].device0_bytes,
                    **flop_rates(model, model_config, b * seq(model, model_config), {'': v}, n),
                }
            )
    return rows


def sweep(counts, rounds: int, model_config=NANOGPT) -> list[dict]:
    """2. Devices 1..8 at a fixed global batch and at a fixed per-device batch."""
    rows = []
    for model, per_device, fixed in (('mlp', 16, 128), ('transformer', 2, 16)):
        for mode in ('fixed global batch', 'fixed per-device batch'):
            runs = {}
            for n in counts:
                b = fixed if mode == 'fixed global batch' else per_device * n
                for twin in TWINS:
                    runs[(twin.NAME, n, b)] = runner(twin, n, model, b, model_config=model_config)
            t = per_step(interleaved(runs, rounds), runs)
            for (twin, n, b), v in t.items():
                rows.append(
                    {
                        'model': model,
                        'mode': mode,
                        'twin': twin,
                        'devices': n,
                        'batch': b,
                        'step_ms': 1e3 * v,
                        'per_sec': runs[(twin, n, b)].units / runs[(twin, n, b)].steps / v,
                        **flop_rates(model, model_config, b * seq(model, model_config), {'': v}, n),
                    }
                )
    return rows
