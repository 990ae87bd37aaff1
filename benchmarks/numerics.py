"""The error model's calibration (shard_parity/numerics.py, docs/numerics.md): every correct pair
as a fraction of its budget, every planted bug as a multiple of it, in bf16 compute.

    SHARD_PARITY_DATA_DIR=... python -m benchmarks.numerics            # the table
    python -m benchmarks.numerics --only=explicit --json=out.json
    python -m benchmarks.numerics --trained=1000 --warmup_steps=0   # on a trained state

Each case runs the bisector's comparison (tools/bisect/divergence.py, --tolerance=model) for --steps
steps from one initial state: a correct pair (one device against a twin, on a mesh) reports each
phase's largest and median error / budget over every leaf it compared; a bug (a tools/zoo entry
against its reference) reports where the model first sees it and by how many budgets.
The criteria (issue 41): correct pairs at most 1/3 of the budget, their median within a factor
30 of it (at least 1/30); bugs at least 10 budgets over. Below the pairs, the median over them
of each pair's largest error / budget per phase (a pair's figure, as the verdict reads it).
'parameters' is the update's parameters alone, over the steps that moved them.
"""

import argparse
import dataclasses
import json
import statistics
import sys

# (label, A, B, model, strategy, mesh axes, compute, reduce, extra model config)
CORRECT = [
    *[(f'{t} data:2,fsdp:2,model:2', 'one_device', t, 'transformer', 'composed',
       (('data', 2), ('fsdp', 2), ('model', 2)), 'bfloat16', 'float32', {})
      for t in ('auto', 'explicit', 'typed')],
    ('explicit dp 8', 'one_device', 'explicit', 'transformer', 'dp', (('data', 8), ('model', 1)),
     'bfloat16', 'float32', {}),
    ('explicit fsdp 8', 'one_device', 'explicit', 'transformer', 'fsdp',
     (('fsdp', 8), ('model', 1)), 'bfloat16', 'float32', {}),
    ('auto tp 4x2', 'one_device', 'auto', 'transformer', 'tp', (('data', 4), ('model', 2)),
     'bfloat16', 'float32', {}),
    ('explicit fsdp 8, reduce bf16', 'one_device', 'explicit', 'transformer', 'fsdp',
     (('fsdp', 8), ('model', 1)), 'bfloat16', 'bfloat16', {}),
    ('explicit data:2,seq:2,model:2', 'one_device', 'explicit', 'transformer', 'composed',
     (('data', 2), ('seq', 2), ('model', 2)), 'bfloat16', 'float32', {}),
    ('explicit fsdp:2,model:2,stage:2', 'one_device', 'explicit', 'transformer', 'composed',
     (('fsdp', 2), ('model', 2), ('stage', 2)), 'bfloat16', 'float32', {}),
    ('explicit data:2,expert:2,model:2 moe', 'one_device', 'explicit', 'transformer',
     'composed', (('data', 2), ('expert', 2), ('model', 2)), 'bfloat16', 'float32',
     {'num_experts': 4, 'experts_per_token': 2}),
    ('auto vs explicit composed', 'auto', 'explicit', 'transformer', 'composed',
     (('data', 2), ('fsdp', 2), ('model', 2)), 'bfloat16', 'float32', {}),
    ('mlp explicit dp 8', 'one_device', 'explicit', 'mlp', 'dp', (('data', 8), ('model', 1)),
     'bfloat16', 'float32', {}),
    ('mlp auto dp 8', 'one_device', 'auto', 'mlp', 'dp', (('data', 8), ('model', 1)),
     'bfloat16', 'float32', {}),
]  # fmt: skip
DP8 = (('data', 8), ('model', 1))
BUGS = [
    ('dp_psum', 'explicit', 'tools.zoo.dp_psum', 'mlp', 'dp', DP8, {}),
    ('no_pcast', 'explicit', 'tools.zoo.no_pcast', 'mlp', 'dp', DP8, {}),
    ('scatter_no_div', 'one_device', 'tools.zoo.scatter_no_div', 'mlp', 'fsdp',
     (('fsdp', 8), ('model', 1)), {}),
    ('replicated_batch', 'auto', 'tools.zoo.replicated_batch', 'mlp', 'dp', DP8, {}),
    ('dropout_key', 'tools.zoo.dropout', 'tools.zoo.dropout_key', 'mlp', 'dp', DP8, {}),
    ('tp_pmean', 'auto', 'tools.zoo.tp_pmean', 'transformer', 'tp', (('data', 4), ('model', 2)),
     {}),
    ('composed_no_data', 'one_device', 'tools.zoo.composed_no_data', 'transformer', 'composed',
     (('data', 2), ('fsdp', 2), ('model', 2)), {}),
    ('composed_too_many', 'one_device', 'tools.zoo.composed_too_many', 'transformer',
     'composed', (('data', 2), ('fsdp', 2), ('model', 2)), {}),
    ('composed_data_only', 'one_device', 'tools.zoo.composed_data_only', 'transformer',
     'composed', (('data', 2), ('seq', 2), ('model', 2)), {}),
    ('ep_swapped_axes', 'explicit', 'tools.zoo.ep_swapped_axes', 'transformer', 'ep',
     (('data', 2), ('expert', 2)), {'num_experts': 4, 'experts_per_token': 2}),
    ('loss_one_short', 'explicit', 'tools.zoo.loss_one_short', 'transformer', 'dp', DP8, {}),
]  # fmt: skip
TRANSFORMER = dict(seq_len=16, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32)


def case_inputs(model, strategy, axes, compute, reduce, extra, train=None):
    """(graphdef, loss_fn, tx, state, batches, plan, mesh) of one case, as the bisector's
    from_flags builds them, with the policy (compute, reduce); `train`: changes to the model's
    training settings (learning_rate=1e-2, warmup_steps=0)."""
    from flax import nnx
    from jax.sharding import AxisType

    from shard_parity import config as cfg
    from shard_parity.mesh import mesh_for
    from shard_parity import plan as plans
    from shard_parity.runtime import tasks
    from shard_parity.step import create_state, make_optimizer

    plan = plans.from_config({  # the plan as a run's config.json records it
        'strategy': strategy, 'mesh': dict(axes),
        'model_config': {'dtype': compute, 'reduce_dtype': reduce},
    })  # fmt: skip
    if model == 'mlp':
        config = dataclasses.replace(cfg.TRAIN_DEFAULTS['mlp'], **(train or {}))
        task = tasks.mnist_task(config, None, False, cfg.MLPConfig(dtype=compute,
                                                                   reduce_dtype=reduce))  # fmt: skip
    else:
        config = dataclasses.replace(cfg.TRAIN_DEFAULTS['transformer'], batch_size=16,
                                     **(train or {}))  # fmt: skip
        shape = cfg.TransformerConfig(**TRANSFORMER, **extra, dtype=compute, reduce_dtype=reduce)
        task = tasks.shakespeare_task(config, shape, None, False)
    tx = make_optimizer(config)
    graphdef, state = create_state(task.make_model(nnx.Rngs(config.seed)), tx)
    return (
        graphdef,
        task.loss_fn,
        tx,
        state,
        task.train_batches,
        plan,
        mesh_for(plan, AxisType.Auto),
    )


def run(a, b, model, strategy, axes, compute, reduce, extra, steps, train=None, trained=0,
        tolerance='model'):  # fmt: skip
    """The bisector's report of A against B for `steps` steps, from the initial state or from
    A's state after `trained` steps of one device's training (the same policy and settings),
    on the batches that run takes next."""
    import jax
    import numpy as np

    from tools.bisect import divergence as D

    graphdef, loss_fn, tx, state, batches, plan, mesh = case_inputs(
        model, strategy, axes, compute, reduce, extra, train
    )
    sides = [D.load_side(name, plan, mesh) for name in (a, b)]
    host = jax.tree.map(np.asarray, state)
    if trained:
        case = (model, compute, reduce, sorted(extra.items()), sorted((train or {}).items()))
        host = train_one_device(graphdef, loss_fn, tx, host, batches, trained, repr(case))
    return D.bisect(*sides, graphdef, loss_fn, tx, host, batches, steps, tolerance,
                    start=trained)  # fmt: skip


_TRAINED = {}


def train_one_device(graphdef, loss_fn, tx, state, batches, steps, case=''):
    """`state` after `steps` steps of one device's training on batches 0..steps-1 (kept per
    process, by `case` and the steps: a trained state serves every test that asks again)."""
    import jax

    from shard_parity.step import one_device_train_step

    key = (case, steps)
    if key not in _TRAINED:
        step = one_device_train_step(graphdef, loss_fn, tx)
        for i in range(steps):
            state, _ = step(state, batches.batch(i))
        _TRAINED[key] = jax.device_get(state)
    return _TRAINED[key]


def correct_row(label, report) -> dict:
    row = {'case': label, 'diverged': report.diverged}
    for phase in ('forward', 'loss', 'gradients', 'update'):
        fractions = [f for p, path, f in report.seen if p == phase and not path.startswith('A: ')
                     and not path.startswith('B: ')]  # fmt: skip
        if fractions:
            row[phase] = (max(fractions), statistics.median(fractions))
    moved = [f for step in parameters(report.seen) if any(step) for f in step]
    if moved:
        row['parameters'] = (max(moved), statistics.median(moved))
    return row


def parameters(seen) -> list[list[float]]:
    """Per step, the parameters' error / budget (A against B). A step whose parameters are all
    exactly equal moved none (a learning rate of 0: the warm-up's first step), and the table's
    parameters column leaves it out."""
    steps = []
    for phase, path, fraction in seen:
        if phase == 'update' and path == 'A vs B: step':
            steps.append([])
        elif phase == 'update' and path.startswith('A vs B: params.'):
            steps[-1].append(fraction)
    return steps


def bug_row(label, report) -> dict:
    first = report.leaves[0] if report.leaves else None
    in_phase = [f for p, _, f in report.seen if p == report.phase] if report.phase else []
    return {
        'case': label,
        'caught': report.diverged,
        'where': f'step {report.step} {report.phase} {report.layer or (first and first.path)}',
        'budgets': first.budgets if first else None,
        'largest': max(in_phase, default=None),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog='python -m benchmarks.numerics', description=__doc__)
    p.add_argument('--steps', type=int, default=2)
    p.add_argument('--only', default='', help='run the cases whose label contains this')
    p.add_argument('--json', default='', help='also write the rows to this file')
    p.add_argument('--trained', type=int, default=0,
                   help='judge the state after this many steps of one device\'s training')
    p.add_argument('--learning_rate', type=float, default=None, help='the peak rate (default: '
                   'the model\'s); with --warmup_steps=0 from the first step')
    p.add_argument('--warmup_steps', type=int, default=None)
    args = p.parse_args(argv)
    train = {k: v for k in ('learning_rate', 'warmup_steps')
             if (v := getattr(args, k)) is not None}  # fmt: skip
    more = {'train': train, 'trained': args.trained}
    from shard_parity.devices import configure_jax

    configure_jax(8)
    rows = []
    phases = ('forward', 'loss', 'gradients', 'update', 'parameters')
    print(f'{"correct pair (bf16)":<34} ' + ' '.join(f'{ph + " max/med":>18}' for ph in phases))
    for label, a, b, model, strategy, axes, compute, reduce, extra in CORRECT:
        if args.only not in label:
            continue
        row = correct_row(label, run(a, b, model, strategy, axes, compute, reduce, extra,
                                     args.steps, **more))  # fmt: skip
        rows.append(row)
        cells = [f'{row[ph][0]:>8.3g} {row[ph][1]:>9.3g}' if ph in row else f'{"-":>18}'
                 for ph in phases]  # fmt: skip
        print(f'{label:<34} ' + ' '.join(cells) + ('  DIVERGED' if row['diverged'] else ''),
              flush=True)  # fmt: skip
    cells = []
    for ph in phases:  # every row so far is a pair's
        worst = [r[ph][0] for r in rows if ph in r]
        cells.append(f'{statistics.median(worst):>18.3g}' if worst else f'{"-":>18}')
    print(f'{"median pair (its largest)":<34} ' + ' '.join(cells))
    print(f'\n{"planted bug (bf16)":<22} {"first seen":<44} {"budgets":>9} {"largest":>9}')
    for label, a, b, model, strategy, axes, extra in BUGS:
        if args.only not in label:
            continue
        try:
            report = run(a, b, model, strategy, axes, 'bfloat16', 'float32', extra, args.steps,
                         **more)  # fmt: skip
        except Exception as e:  # noqa: BLE001  (a missing entry, a failure: a row that says so)
            print(f'{label:<22} failed: {str(e)[:80]}', flush=True)
            continue
        row = bug_row(label, report)
        rows.append(row)
        print(
            f'{label:<22} {row["where"]:<44.44} {row["budgets"] or 0:>9.3g} '
            f'{row["largest"] or 0:>9.3g}' + ('' if row['caught'] else '  MISSED'),
            flush=True,
        )
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
