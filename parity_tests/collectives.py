"""What the compiler inserted: every collective in the compiled train step of each twin.

    python -m parity_tests.collectives --model=mlp --cpu_devices=8
    python -m parity_tests.collectives --model=transformer --num_kv_heads=1 --cpu_devices=8 --json
    python -m parity_tests.collectives --model=transformer --strategy=tp --mesh=4x2 --cpu_devices=8

Lowers and compiles the train step of the one-device run, auto/, explicit/ and typed/
(shapes only: no data is read), lists each program's collectives from its optimized HLO, prints
the analytic expectation of the strategy beside them, and flags whatever auto/ moves that
explicit/ does not, and typed/ likewise against explicit/ (`typed_differences`). Takes the train CLI's model, batch, --strategy and --mesh flags.
"""

import collections
import dataclasses
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx
from jax.sharding import NamedSharding

import auto
import explicit
import typed
from parity_tests.hlo import collectives
from shard_parity import UsageError
from shard_parity.mesh import DATA, MODEL, SEQ, configure_jax, make_mesh, with_axis_type
from shard_parity.model.mlp import MLP
from shard_parity.model.transformer import Transformer
from shard_parity.placement import BATCH, mesh_axes, state_shardings, state_specs
from shard_parity.runtime import config as cfg
from shard_parity.runtime import declare_key_flags, tasks
from shard_parity.runtime import flags as F
from shard_parity.runtime.train import check_batch, check_strategy
from shard_parity.step import create_state, make_optimizer, one_device_train_step

JSON = flags.DEFINE_bool('json', False, 'Print one JSON object instead of the tables.')


def model_and_batch(model: str, batch_size: int, model_config=None):
    """(model factory, loss, abstract host batch) for `model`, without touching any data."""
    if model == 'mlp':
        batch = {
            'image': jax.ShapeDtypeStruct((batch_size, 784), jnp.float32),
            'label': jax.ShapeDtypeStruct((batch_size,), jnp.int32),
        }
        return (lambda rngs: MLP(cfg.MLPConfig(), rngs=rngs)), tasks.classification_loss, batch
    model_config = model_config or cfg.TransformerConfig()
    tokens = jax.ShapeDtypeStruct((batch_size, model_config.seq_len), jnp.int32)
    return (
        (lambda rngs: Transformer(model_config, rngs=rngs)),
        tasks.lm_loss,
        {'x': tokens, 'y': tokens},
    )


def with_sharding(tree, mesh, spec):
    s = NamedSharding(mesh, spec)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree)


def inspect(
    model: str, config: cfg.TrainConfig, mesh, strategy: str = 'dp', model_config=None
) -> dict:
    """Compiles the three train steps and returns their collectives and the expectation.
    `model_config`: the transformer's shape (default: TransformerConfig()); unused by the MLP."""
    model_config = model_config or cfg.TransformerConfig()
    make_model, loss_fn, batch = model_and_batch(model, config.batch_size, model_config)
    tx = make_optimizer(config)
    graphdef, state = nnx.eval_shape(lambda: create_state(make_model(nnx.Rngs(0)), tx))
    programs = {'one_device': one_device_train_step(graphdef, loss_fn, tx).lower(state, batch)}
    for twin in (auto, explicit, typed):
        if strategy not in twin.STRATEGIES:
            continue
        twin_mesh = with_axis_type(mesh, twin.AXIS_TYPE)  # typed/: the same devices, Explicit
        shardings = state_shardings(state, twin_mesh, strategy)
        abstract_state = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings
        )
        step = twin.STRATEGIES[strategy].train_step(graphdef, loss_fn, tx, twin_mesh)
        programs[twin.NAME] = step.lower(abstract_state, with_sharding(batch, twin_mesh, BATCH))
    found = {
        name: [
            dataclasses.asdict(c) | {'bytes': c.bytes, 'group_size': c.group_size}
            for c in collectives(lowered.compile().as_text())
        ]
        for name, lowered in programs.items()
    }
    expected = expectation(strategy, model, state.params, mesh, config.batch_size, model_config)
    return {
        'model': model,
        'strategy': strategy,
        'devices': mesh.size,
        'mesh': 'x'.join(map(str, mesh.devices.shape)),
        'axes': list(mesh.axis_names),
        'batch_size': config.batch_size,
        'programs': found,
        'expected': expected,
        'differences': differences(found['auto'], found['explicit']),
        'typed_differences': (
            differences(found['typed'], found['explicit'], 'typed') if 'typed' in found else None
        ),
    }


def expectation(strategy: str, model: str, params, mesh, batch_size: int, model_config) -> dict:
    """The analytic collectives of one step: the gradient's over 'data', the activations' over
    'model' (tensor parallelism only), the keys' and values' round the 'seq' ring (cp only)."""
    if strategy == 'cp':
        return cp_expectation(params, mesh, batch_size, model_config)
    d, m = mesh.shape[DATA], mesh.shape[MODEL]
    specs = jax.tree.leaves(state_specs(params, strategy, mesh))
    # each device's share of the gradient after tensor parallelism's split (all of it without)
    grad_bytes = sum(
        int(np.prod(p.shape)) * p.dtype.itemsize // (m if MODEL in spec else 1)
        for p, spec in zip(jax.tree.leaves(params), specs, strict=True)
    )
    expected = {
        'kind': 'all-reduce',
        'group_size': d,
        'gradient_bytes': grad_bytes,
        'ring_bytes_per_device': 2 * (d - 1) / d * grad_bytes,
        'note': "one all-reduce of the gradients over 'data' (plus the averaged metric scalars) "
        'per step; XLA may combine it into one tuple-shaped op. A ring moves 2(N-1)/N of it.',
        'activations': None,
    }
    if strategy in ('fsdp', 'fsdp_tp'):
        expected |= {
            'kind': 'all-gather + reduce-scatter',
            'note': 'each sharded weight all-gathered over \'data\' where it is used (the whole '
            'weight comes back, (N-1)/N of it over the wire) and its gradient reduce-scattered '
            '((N-1)/N again): the same bytes as one all-reduce, in two halves. Small unsharded '
            'arrays (biases whose size N does not divide) are all-reduced as in dp.',
        }
    if strategy in ('tp', 'fsdp_tp') and m > 1:
        expected['activations'] = activation_all_reduces(model, batch_size // d, m, model_config)
    return expected


def activation_all_reduces(model: str, rows: int, m: int, c) -> dict:
    """Tensor parallelism's all-reduces over 'model', each of a [rows, ..., width] activation:
    forward, one after every row-parallel layer; backward, one for the gradient of every
    column-parallel layer's input (none for the MLP's first layer: its input is the data)."""
    if model == 'mlp':
        count, shape = 1, (rows, 512)
        note = (
            'forward: the partial sums of the row-parallel second layer; no backward one: the '
            "first (column-parallel) layer's input is the data, which needs no gradient."
        )
    else:
        # forward: attention out, ffn down; backward: query, key_value and ffn up inputs
        count, shape = 5 * c.num_layers, (rows, c.seq_len, c.embed_dim)
        note = (
            'forward: the partial sums of each row-parallel layer (attention out, ffn down); '
            'backward: the input gradient of each column-parallel layer. query and key_value '
            'read the same input but are two layers, so its gradient is all-reduced twice.'
        )
    each = int(np.prod(shape)) * 4
    return {
        'kind': 'all-reduce',
        'group_size': m,
        'count': count,
        'shape': shape,
        'bytes': count * each,
        'ring_bytes_per_device': 2 * (m - 1) / m * count * each,
        'note': note,
    }


def cp_expectation(params, mesh, batch_size: int, c) -> dict:
    """Context parallelism: the gradient all-reduce over both axes (every device's loss is a
    different term), and explicit's ring (shard_parity/model/ring.py): per attention layer, a
    loop of n - 1 passes of this device's K/V block f32[B/d, T/n, K, D] (keys, values) forward;
    in the backward a loop of n - 1 passes of the keys, values and their gradients so far, and
    one more pass of the gradients: 8 collective-permutes in the program, 6n - 4 run. auto/ has
    no ring: XLA picks its own collectives for attention."""
    d, n = mesh.shape[DATA], mesh.shape[SEQ]
    grad_bytes = sum(int(np.prod(p.shape)) * p.dtype.itemsize for p in jax.tree.leaves(params))
    block = (batch_size // d, c.seq_len // n, c.num_kv_heads, c.head_dim)
    each = int(np.prod(block)) * 4  # one key or value block, float32 inside the ring
    per_layer = 2 + 4 + 2  # ops: forward loop (k, v), backward loop (k, v, dk, dv), last (dk, dv)
    runs = 2 * (n - 1) + 4 * (n - 1) + 2  # the loops run n - 1 times
    return {
        'kind': 'all-reduce',
        'group_size': d * n,
        'gradient_bytes': grad_bytes,
        'ring_bytes_per_device': 2 * (d * n - 1) / (d * n) * grad_bytes,
        'note': "one all-reduce of the gradients over 'data' and 'seq' together (plus the "
        'averaged metric), as dp over all the devices. A ring moves 2(N-1)/N of it.',
        'activations': None,
        'ring': {
            'kind': 'collective-permute',
            'group_size': d * n,  # d rings of n devices, one permute: a source->target pair each
            'ring_size': n,
            'count': per_layer * c.num_layers,
            'per_layer': per_layer,
            'shape': block,
            'bytes_each': each,
            'runs_per_layer': runs,
            'bytes': runs * c.num_layers * each,
            'note': f'explicit only: per attention layer, {n - 1} passes of the keys and values '
            f'round each ring of {n} (forward, one loop), {n - 1} of the keys, values and their '
            'gradients so far (backward, one loop), and one more of the gradients, home; one '
            'collective-permute per array and pass; each device sends and receives one block '
            'per permute.',
        },
    }


def signature(ops) -> collections.Counter:
    """What a program moves, independent of layout: (kind, group size, elements) per operand."""
    return collections.Counter(
        (op['kind'], op['group_size'], int(np.prod(s))) for op in ops for s in op['shapes']
    )


def differences(auto_ops, explicit_ops, name: str = 'auto') -> list[str]:
    a, e = signature(auto_ops), signature(explicit_ops)
    out = [
        f'{name} has {k[0]} of {k[2]:,} elements over {k[1]} devices that explicit lacks (x{v})'
        for k, v in (a - e).items()
    ]
    out += [
        f'explicit has {k[0]} of {k[2]:,} elements over {k[1]} devices that {name} lacks (x{v})'
        for k, v in (e - a).items()
    ]
    return out


def print_report(r: dict) -> None:
    print(
        f"Collectives in one compiled train step: --model={r['model']} --strategy="
        f"{r['strategy']}, mesh {r['mesh']} ({' x '.join(r['axes'])}), global batch "
        f"{r['batch_size']}\n"
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
    if ring := x.get('ring'):
        print(
            f"expected (explicit): {ring['count']} collective-permutes ({ring['per_layer']} per "
            f"attention layer, {ring['runs_per_layer']} run) of f32{list(ring['shape'])} blocks, "
            f"{ring['bytes_each']:,} bytes each, "
            f"{ring['bytes']:,} in all.\n  {ring['note']}"
        )
    if a := x['activations']:
        print(
            f"expected: {a['count']} all-reduce(s) of f32{list(a['shape'])} activations over "
            f"{a['group_size']} devices, {a['bytes']:,} bytes.\n  {a['note']}"
        )
    for name in [n for n in r['programs'] if n != 'one_device']:
        got = collections.Counter()
        for op in r['programs'][name]:
            got[op['kind']] += op['bytes']
        print(f'{name:<10} moves ' + ', '.join(f'{k} {v:,} bytes' for k, v in got.items()))
    for key, pair in (
        ('differences', 'auto and explicit'),
        ('typed_differences', 'typed and explicit'),
    ):
        if r[key] is None:
            continue
        print(f'\ndifferences between {pair}: ' + ('none' if not r[key] else ''))
        for d in r[key]:
            print(f'  - {d}')


def main(argv):
    if len(argv) > 1:
        sys.exit(f'error: unexpected arguments {argv[1:]}')
    try:
        configure_jax(F.CPU_DEVICES.value, cpu_fma=F.CPU_FMA.value)
        mesh = make_mesh(F.NUM_DEVICES.value, F.mesh_shape(), mesh_axes(F.STRATEGY.value))
        config = F.train_config()
        check_batch(config.batch_size, mesh)  # the train CLI's checks, same messages
        model_config = F.transformer_config() if F.MODEL.value != 'mlp' else cfg.MLPConfig()
        check_strategy(F.STRATEGY.value, model_config, mesh)
        report = inspect(F.MODEL.value, config, mesh, F.STRATEGY.value, model_config)
    except UsageError as e:
        sys.exit(f'error: {e}')
    if JSON.value:
        print(json.dumps(report, indent=1))
    else:
        print_report(report)


if __name__ == '__main__':
    declare_key_flags(
        [F.MODEL, F.STRATEGY, F.MESH, F.TRAIN['batch_size'], *F.TRANSFORMER_SHAPE, F.CPU_DEVICES]
        + [F.CPU_FMA, F.NUM_DEVICES]
    )
    app.run(main)
