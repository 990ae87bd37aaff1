"""What the compiler inserted: every collective in the compiled train step of each twin.

    python -m parity_tests.collectives --model=mlp --cpu_devices=8
    python -m parity_tests.collectives --model=transformer --num_kv_heads=1 --cpu_devices=8 --json

Lowers and compiles the train step of the one-device reference, auto/ and explicit/ (shapes
only: no data is read), lists each program's collectives from its optimized HLO, prints the
analytic expectation for data parallelism beside them, and flags whatever one twin moves that
the other does not. Takes the train CLI's model and batch flags.
"""

import collections
import dataclasses
import importlib
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx
from jax.sharding import NamedSharding

from auto import train_step as auto
from explicit import train_step as explicit
from parity_tests.hlo import collectives
from shard_parity import UsageError, tasks
from shard_parity import config as cfg
from shard_parity import flags as F
from shard_parity.mesh import configure_jax, make_mesh
from shard_parity.models import MLP
from shard_parity.step import create_state, make_optimizer, reference_train_step
from shard_parity.transformer import Transformer

JSON = flags.DEFINE_bool('json', False, 'Print one JSON object instead of the tables.')


def model_and_batch(model: str, batch_size: int):
    """(model factory, loss, abstract host batch) for `model`, without touching any data."""
    if model == 'mlp':
        batch = {
            'image': jax.ShapeDtypeStruct((batch_size, 784), jnp.float32),
            'label': jax.ShapeDtypeStruct((batch_size,), jnp.int32),
        }
        return (lambda rngs: MLP(cfg.MLPConfig(), rngs=rngs)), tasks.classification_loss, batch
    model_config = F.transformer_config()
    tokens = jax.ShapeDtypeStruct((batch_size, model_config.seq_len), jnp.int32)
    return (
        (lambda rngs: Transformer(model_config, rngs=rngs)),
        tasks.lm_loss,
        {'x': tokens, 'y': tokens},
    )


def with_sharding(tree, mesh, spec):
    s = NamedSharding(mesh, spec)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree)


def inspect(model: str, config: cfg.TrainConfig, mesh, strategy: str = 'dp') -> dict:
    """Compiles the three train steps and returns their collectives and the expectation."""
    make_model, loss_fn, batch = model_and_batch(model, config.batch_size)
    tx = make_optimizer(config)
    graphdef, state = nnx.eval_shape(lambda: create_state(make_model(nnx.Rngs(0)), tx))
    programs = {'reference': reference_train_step(graphdef, loss_fn, tx).lower(state, batch)}
    for twin in (auto, explicit):
        if strategy != 'dp':  # <twin>/fsdp.py has the same interface as <twin>/train_step.py
            twin = importlib.import_module(f'{twin.__name__.split(".")[0]}.{strategy}')
        step = twin.train_step(graphdef, loss_fn, tx, mesh)
        state_shardings = twin.state_shardings(state, mesh)
        abstract_state = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, state_shardings
        )
        args = (abstract_state, with_sharding(batch, mesh, twin.BATCH))
        programs[twin.__name__.split('.')[0]] = step.lower(*args)
    found = {
        name: [
            dataclasses.asdict(c) | {'bytes': c.bytes, 'group_size': c.group_size}
            for c in collectives(lowered.compile().as_text())
        ]
        for name, lowered in programs.items()
    }
    n = mesh.size
    grad_bytes = sum(
        int(np.prod(p.shape)) * p.dtype.itemsize for p in jax.tree.leaves(state.params)
    )
    expected = {
        'kind': 'all-reduce',
        'group_size': n,
        'gradient_bytes': grad_bytes,
        'ring_bytes_per_device': 2 * (n - 1) / n * grad_bytes,
        'note': 'one all-reduce of the gradients (plus the averaged metric scalars) per step; '
        'XLA may combine it into one tuple-shaped op. A ring moves 2(N-1)/N of it.',
    }
    if strategy == 'fsdp':
        expected |= {
            'kind': 'all-gather + reduce-scatter',
            'ring_bytes_per_device': 2 * (n - 1) / n * grad_bytes,
            'note': 'each sharded weight all-gathered where it is used (the whole weight comes '
            'back, (N-1)/N of it over the wire) and its gradient reduce-scattered ((N-1)/N '
            'again): the same bytes as one all-reduce, in two halves. Small unsharded arrays '
            '(biases whose size N does not divide) are all-reduced as in dp.',
        }
    return {
        'model': model,
        'strategy': strategy,
        'devices': n,
        'batch_size': config.batch_size,
        'programs': found,
        'expected': expected,
        'differences': differences(found['auto'], found['explicit']),
    }


def signature(ops) -> collections.Counter:
    """What a program moves, independent of layout: (kind, group size, elements) per operand."""
    return collections.Counter(
        (op['kind'], op['group_size'], int(np.prod(s))) for op in ops for s in op['shapes']
    )


def differences(auto_ops, explicit_ops) -> list[str]:
    a, e = signature(auto_ops), signature(explicit_ops)
    out = [
        f'auto has {k[0]} of {k[2]:,} elements over {k[1]} devices that explicit lacks (x{v})'
        for k, v in (a - e).items()
    ]
    out += [
        f'explicit has {k[0]} of {k[2]:,} elements over {k[1]} devices that auto lacks (x{v})'
        for k, v in (e - a).items()
    ]
    return out


def print_report(r: dict) -> None:
    print(
        f"Collectives in one compiled train step: --model={r['model']} "
        f"--strategy={r['strategy']}, {r['devices']} devices, global batch {r['batch_size']}\n"
    )
    print(f"{'program':<10} {'kind':<12} {'group':>5} {'dtype':<6} {'bytes':>12}  result shapes")
    for name, ops in r['programs'].items():
        if not ops:
            print(f'{name:<10} (none)')
        for op in ops:
            shapes = ', '.join('[' + ','.join(map(str, s)) + ']' for s in op['shapes'])
            dtypes = ','.join(sorted(set(op['dtypes'])))
            head = f"{name:<10} {op['kind']:<12} {op['group_size']:>5} {dtypes:<6}"
            print(f"{head} {op['bytes']:>12,}  {shapes}")
    x = r['expected']
    print(
        f"\nexpected: {x['kind']} of the {x['gradient_bytes']:,} gradient bytes over "
        f"{x['group_size']} devices; a ring moves {x['ring_bytes_per_device']:,.0f} bytes per "
        f"device.\n  {x['note']}"
    )
    for name in ('auto', 'explicit'):
        got = collections.Counter()
        for op in r['programs'][name]:
            got[op['kind']] += op['bytes']
        print(f'{name:<10} moves ' + ', '.join(f'{k} {v:,} bytes' for k, v in got.items()))
    print('\ndifferences between the twins: ' + ('none' if not r['differences'] else ''))
    for d in r['differences']:
        print(f'  - {d}')


def main(argv):
    if len(argv) > 1:
        sys.exit(f'error: unexpected arguments {argv[1:]}')
    try:
        configure_jax(F.CPU_DEVICES.value, cpu_fma=F.CPU_FMA.value)
        mesh = make_mesh(F.NUM_DEVICES.value)
        config = F.train_config()
        if config.batch_size % mesh.size:
            raise UsageError(
                f'--batch_size={config.batch_size} is not divisible by the {mesh.size} devices'
            )
        report = inspect(F.MODEL.value, config, mesh, F.STRATEGY.value)
    except UsageError as e:
        sys.exit(f'error: {e}')
    if JSON.value:
        print(json.dumps(report, indent=1))
    else:
        print_report(report)


if __name__ == '__main__':
    app.run(main)
