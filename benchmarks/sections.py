"""The measurements of `python -m benchmarks.run`, one function per section of the results.

Every section builds synthetic batches (speed does not depend on the data) and random weights,
and times its candidates side by side with benchmarks.timing.interleaved.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks.timing import interleaved
from shard_parity import auto, explicit, typed
from shard_parity import plan as plans
from shard_parity.mesh import mesh_for
from shard_parity.model import attention
from shard_parity.model.mlp import MLP
from shard_parity.model.transformer import Transformer
from shard_parity.placement import place_batch, place_state
from shard_parity.runtime import config as cfg
from shard_parity.runtime import generate, tasks
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
        step = twin.STRATEGIES[plan.strategy].train_step(graphdef, loss, tx, on)
        placed, batch = place_state(state, on, plan.strategy), place_batch(batch, on, plan.strategy)
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


def per_step(medians, runs):
    return {k: medians[k] / runs[k].steps for k in runs}


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
                    }
                )
    return rows


def attention_sweep(lengths, rounds: int, dtype=jnp.float32) -> list[dict]:
    """3. naive vs fused attention, forward and backward of one layer: latency and XLA's
    compiled temporary memory (memory_analysis), where naive's T x T scores show up."""
    rows = []
    for t in lengths:
        k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
        q, k, v = (jax.random.normal(key, (1, t, 4, 32), dtype) for key in (k1, k2, k3))
        fns, temp = {}, {}
        for name in ('naive', 'fused'):
            f = jax.jit(
                jax.grad(
                    lambda q, k, v, f=attention.ATTENTION[name]: f(q, k, v).sum(), argnums=(0, 1, 2)
                )
            )
            compiled = f.lower(q, k, v).compile()
            temp[name] = compiled.memory_analysis().temp_size_in_bytes
            fns[name] = lambda c=compiled: jax.block_until_ready(c(q, k, v))
        med = interleaved(fns, rounds, warmup=1)
        rows.append(
            {
                'seq_len': t,
                **{f'{n}_ms': 1e3 * med[n] for n in fns},
                **{f'{n}_temp_bytes': temp[n] for n in fns},
            }
        )
    return rows


# 7. Context parallelism: who holds what of a sequence of T positions on 8 devices. dp gives each
# device whole sequences (8x1, one per device); cp splits one sequence 8 ways (1x8, T/8 each).
CONTEXT_CANDIDATES = {  # name -> (twin, --strategy, --mesh, global batch, attention)
    'dp naive': (explicit, 'dp', '8x1', 8, 'naive'),
    'dp fused': (explicit, 'dp', '8x1', 8, 'fused'),
    'cp explicit': (explicit, 'cp', '1x8', 1, 'naive'),  # the ring ignores --attention
    'cp typed': (typed, 'cp', '1x8', 1, 'naive'),
    'cp auto': (auto, 'cp', '1x8', 1, 'naive'),  # XLA partitions naive attention
}


def context(lengths, timed_lengths, rounds: int) -> list[dict]:
    """7. One transformer block (4 heads of 32, width 128) at sequence length T on 8 devices:
    XLA's temporary memory per device of the compiled train step (memory_analysis: the same
    program runs on every device), and the step time where T is short enough to run here.
    Each device holds T positions under dp, T/8 under cp. Beside cp, the analytic expectation
    (`cp_expected_bytes`): flash attention's memory on whole sequences (dp fused) split 8 ways,
    what a ring that keeps no score matrix (shard_parity/model/ring.py) should approach."""
    import dataclasses

    rows = []
    for t in lengths:
        row, runs = {'seq_len': t}, {}
        for name, (twin, strategy, text, b, attn) in CONTEXT_CANDIDATES.items():
            config = dataclasses.replace(NANOGPT, seq_len=t, num_layers=1, attention=attn)
            graphdef, tx, state, loss, batch, units = setup('transformer', b, config)
            mesh = mesh_for(mesh_plan(text, strategy, 8), twin.AXIS_TYPE)
            step = twin.STRATEGIES[strategy].train_step(graphdef, loss, tx, mesh)
            placed, placed_batch = place_state(state, mesh, strategy), place_batch(batch, mesh, strategy)
            compiled = step.lower(placed, placed_batch).compile()
            row[f'{name}_temp_bytes'] = compiled.memory_analysis().temp_size_in_bytes
            row[f'{name}_tokens_per_device'] = b * t // 8
            if t in timed_lengths:
                runs[name] = runner(twin, 8, 'transformer', b, 3, config, text, strategy)
        row['cp_expected_bytes'] = row['dp fused_temp_bytes'] / 8
        if runs:
            med = interleaved(runs, rounds, warmup=1)
            row |= {f'{k}_ms': 1e3 * med[k] / runs[k].steps for k in runs}
        rows.append(row)
    return rows


def generation(lengths, rounds: int, model_config=NANOGPT) -> list[dict]:
    """4. Bytes/s of the padded path vs the KV-cache path."""
    graphdef, params = nnx.split(Transformer(model_config, rngs=nnx.Rngs(0)))
    gen = generate.Generator(graphdef, params)
    rows = []
    for n in lengths:
        fns = {
            'padded': lambda: gen.generate(b'ROMEO:', n),
            'kv_cache': lambda: gen.generate(b'ROMEO:', n, kv_cache=True),
        }
        med = interleaved(fns, rounds, warmup=1)
        rows.append({'new_bytes': n, **{f'{k}_bytes_per_sec': n / med[k] for k in fns}})
    return rows


def matmul_peak(dtype=jnp.float32, rounds=7) -> float:
    """FLOP/s of one large matmul in the model's compute dtype on one device: the machine's
    practical peak. 1024 x 1024 on the CPU; 8192 x 8192 on a GPU, which a smaller one leaves
    partly idle."""
    n = 1024 if jax.devices()[0].platform == 'cpu' else 8192
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    f = jax.jit(lambda a: a @ a)
    med = interleaved({'mm': lambda: jax.block_until_ready(f(a))}, rounds)
    return 2 * n**3 / med['mm']


def nanogpt(rounds: int, model_config=NANOGPT, batch_size=12) -> dict:
    """5. The transformer at nanoGPT's CPU configuration on one device: tokens/s, the share of
    the backward pass, and achieved FLOP/s against the measured matmul peak."""
    graphdef, tx, state, loss, batch, units = setup('transformer', batch_size, model_config)
    step = one_device_train_step(graphdef, loss, tx)
    flops = step.lower(state, batch).compile().cost_analysis()['flops']
    fwd = jax.jit(lambda p, b: loss(nnx.merge(graphdef, p), b)[0])
    train = runner(None, 1, 'transformer', batch_size, steps=10, model_config=model_config)
    forward = lambda: [jax.block_until_ready(fwd(state.params, batch)) for _ in range(10)]  # noqa: E731
    candidates = {'train': train, 'forward': forward}
    if jax.device_count() >= 2 and jax.devices()[0].platform == 'cpu':
        # Small matmuls on one XLA:CPU device barely use a second core; nanoGPT's PyTorch used
        # both. The same step data-parallel over 2 emulated devices (explicit twin): one per core.
        candidates['two_devices'] = runner(
            explicit, 2, 'transformer', batch_size, steps=10, model_config=model_config
        )
    med = interleaved(candidates, rounds)
    step_s, fwd_s = med['train'] / 10, med['forward'] / 10
    n_params = sum(p.size for p in jax.tree.leaves(state.params))
    c, t, layers = model_config.embed_dim, model_config.seq_len, model_config.num_layers
    analytic = units * (6 * n_params + 12 * layers * c * t)  # nanoGPT's estimate_mfu formula
    peak = matmul_peak(model_config.compute_dtype)
    two = {}  # only where a second CPU device ran the step too
    if 'two_devices' in med:
        two_s = med['two_devices'] / 10
        two = {'two_devices_step_ms': 1e3 * two_s, 'two_devices_tokens_per_sec': units / two_s}
    return {
        **two,
        'batch': batch_size,
        'seq_len': t,
        'step_ms': 1e3 * step_s,
        'tokens_per_sec': units / step_s,
        'forward_ms': 1e3 * fwd_s,
        'step_over_forward': step_s / fwd_s,
        'xla_flops_per_step': flops,
        'analytic_flops_per_step': analytic,
        'achieved_flops_per_sec': analytic / step_s,
        'matmul_peak_flops_per_sec': peak,
        'fraction_of_peak': analytic / step_s / peak,
    }
