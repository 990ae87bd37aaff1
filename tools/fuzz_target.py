"""The fuzzer's compile-only check (python -m tools.fuzz --target=tpu-v5e-8): each draw's train
step compiled for a TPU slice with libtpu, from shapes alone (nothing runs), and its
collectives held to what the plan's axes say of every gradient.

The inspector does the compiling and the reading (inspector/target.py: the slice's devices;
inspector/program.py's analyse: each collective's kind, mesh axes, phase and operand shapes).
What each gradient leaf must be reduced over comes from the plan (inspector/records.py's
`averaged_over`: the batch axes it is not split over, 'fsdp' by its reduce-scatter) and the
schedule (1F1B and interleaved all-reduce the gradients outside the blocks over 'stage': each
stage holds its own copy of them, and only the first and last use theirs). A collective is a
gradient's when one of its operands has the shape of a leaf's gradient on one device (whole,
per layer of the stacked blocks, or gathered over 'fsdp' before its reduce-scatter). Then:

    every reduction of a gradient runs over axes the plan allows for that leaf (so none over
        'model', nor over 'stage' outside 1F1B's non-block leaves);
    each leaf is reduced over every axis the plan says, by one op or several (in a twin that
        writes its collectives: the partitioner may gather activations instead);
    no all-gather over 'expert' of an expert's weights (each device keeps its own experts).
"""

import math

import jax
from flax import nnx

from shard_parity.inspector import target as targets
from shard_parity.inspector.program import analyse
from shard_parity.inspector.records import Array, averaged_over
from shard_parity.inspector.twins import model_and_batch, with_sharding
from shard_parity.mesh import EXPERT, FSDP, SEQ, STAGE
from shard_parity.placement import is_expert, layer_dims, rows, state_shardings, state_specs
from shard_parity.step import create_state

REDUCTIONS = ('all-reduce', 'reduce-scatter')
PARTITIONED = ('auto', 'typed')  # twins whose collectives the partitioner places
PER_LEAF_STAGE = ('1f1b', 'interleaved')
LAYERS = 'shard_parity/model/'  # where the layers' own collectives are attributed  # schedules that reduce the non-block leaves over 'stage'


def compiled_ops(side, start, target: str) -> list[dict]:
    """The collectives of `side`'s train step for the draw `start` (tools.bisect.started),
    compiled for `target`'s devices (nothing runs): inspector.program.analyse's ops."""
    chosen = targets.get(target)
    mesh = targets.mesh_on(side.mesh, targets.devices(target))  # the twin's axis types
    graphdef, state = nnx.eval_shape(
        lambda: create_state(start.task.make_model(nnx.Rngs(0)), start.tx)
    )
    shardings = state_shardings(state, mesh, side.plan)
    abstract = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings
    )
    config = start.task.model_config
    _, _, batch = model_and_batch(start.task.name, start.config.batch_size, config)
    step = side.module.train_step(graphdef, start.loss_fn, start.tx, mesh, side.plan)
    with targets.uncached():
        compiled = step.lower(abstract, with_sharding(batch, mesh, rows(side.plan))).compile()
    return analyse(compiled, mesh, chosen.hardware, (), chosen)['ops']


def leaves(plan, params, mesh) -> list[dict]:
    """Each parameter's gradient as the program may carry it: its path, the shapes it may have
    on one device, the axes it must be reduced over, and those it may be."""
    specs = jax.tree.leaves(state_specs(params, plan, mesh))
    out = []
    pairs = zip(jax.tree_util.tree_leaves_with_path(params), specs, strict=True)
    for (path, p), spec in pairs:
        split = [tuple(d if isinstance(d, tuple) else (d,)) if d else () for d in spec]
        split += [()] * (len(p.shape) - len(split))
        axes = tuple(a for d in split for a in d)
        stacked = bool(layer_dims(path))
        plan_says = averaged_over(plan, Array(0, axes, stacked, is_expert(path)))
        must = [a for a in plan_says if plan.size(a) > 1]  # over an axis of 1: nothing to do
        may = set(plan_says) | ({FSDP} if plan.uses(FSDP) else set())
        if not stacked and plan.uses(STAGE) and plan.schedule in PER_LEAF_STAGE:
            may |= {STAGE}
        local = [n // math.prod(plan.size(a) for a in d) for n, d in zip(p.shape, split)]
        gathered = [  # before the reduce-scatter over 'fsdp': whole over it
            n * (plan.size(FSDP) if FSDP in d else 1) for n, d in zip(local, split)
        ]
        shapes = {tuple(local), tuple(gathered)}
        if stacked:  # a scan over the layers may reduce each layer's gradient inside it
            shapes |= {s[1:] for s in list(shapes)}
        shapes = {dims(s) for s in shapes}
        out.append({'path': jax.tree_util.keystr(path), 'shapes': shapes, 'must': set(must),
                    'may': may, 'expert': is_expert(path) and EXPERT in axes})  # fmt: skip
    return out


def activation(shape, plan, start) -> bool:
    """Whether `shape` may be an activation's on one device (its rows, or a microbatch's,
    first; the transformer's positions next): a reduction of one over 'model' is tensor
    parallelism's, not a gradient's, and a gradient of the same shape cannot be told from it."""
    row_devices = math.prod(plan.size(a) for a in plan.rows)
    b = start.config.batch_size // row_devices
    firsts = {b, max(b // (plan.microbatches if plan.uses(STAGE) else 1), 1)}
    if start.task.name == 'mlp':
        return len(shape) >= 1 and shape[0] in firsts
    t, experts = start.task.model_config.seq_len, start.task.model_config.num_experts
    seconds = {t, t // plan.size(SEQ)} | ({experts} if experts else set())  # positions, experts
    return len(shape) >= 2 and shape[0] in firsts and shape[1] in seconds


def wrong(ops, grads, is_activation=lambda shape: False, written: bool = True,
          layers_own=lambda op: False) -> list[str]:  # fmt: skip
    """What breaks the rules above, one line each (none: the program is as the plan says).
    The forward's reductions are the activations'; a shape `is_activation` says may be an
    activation's counts towards the axes a leaf is reduced over, and is never called wrong.
    `written`: the twin writes its collectives (explicit/, a module of yours), so a leaf never
    reduced over an axis it must be is wrong; where the partitioner places them (auto/, typed/)
    it may gather the activations over the batch axes instead and make each gradient whole
    where it is used (measured: auto/ and typed/ on data:2,stage:4; auto/'s experts on data:8).
    `layers_own(op)`: a reduction the layers themselves make (a written twin's backward in
    shard_parity/model/: tensor parallelism's psums, a gathered layer's reduce-scatter),
    counted and never blamed; what the twin writes after grad is held to the rules."""
    out, reduced = [], {g['path']: set() for g in grads}
    for op in ops:
        if op['phase'] == 'forward' and op['kind'] in REDUCTIONS:  # the activations'
            continue
        axes = set(op['axes'] or ())
        gathers = any(p['kind'] == 'all-gather' for p in op.get('stands_for', []))
        for shape in {tuple(s) for s in op['shapes'] if len(s)}:
            mine = [g for g in grads if dims(shape) in g['shapes']]
            if is_activation(shape) or layers_own(op):  # counted, never blamed
                for g in mine:
                    reduced[g['path']] |= axes if op['kind'] in REDUCTIONS else set()
                continue
            if op['kind'] in REDUCTIONS and mine and not gathers:
                for g in mine:
                    reduced[g['path']] |= axes
                if not any(axes <= g['may'] for g in mine):
                    paths = ' or '.join(g['path'] for g in mine)
                    may = '/'.join(sorted(set().union(*(g['may'] for g in mine)))) or 'nothing'
                    out.append(f'{op["kind"]} over {"/".join(sorted(axes))} at {where(op)} '
                               f'reduces the gradient of {paths} {list(shape)}, which the plan '
                               f'reduces over {may}')  # fmt: skip
            if op['kind'] == 'all-gather' and EXPERT in axes and any(g['expert'] for g in mine):
                path = next(g['path'] for g in mine if g['expert'])
                out.append(f"all-gather over 'expert' at {where(op)} gathers {path}, an expert's "
                           'weights (each device keeps its own experts)')  # fmt: skip
    for g in grads if written else []:
        missing = g['must'] - reduced[g['path']]
        if missing:
            out.append(f'the gradient of {g["path"]} is never reduced over '
                       f'{"/".join(sorted(missing))}, as the plan says it must be')  # fmt: skip
    return out


def dims(shape) -> tuple:
    """A shape's dimensions in order of size: the partitioner may reduce a gradient
    transposed (a dot's [out, in]) and transpose it after."""
    return tuple(sorted(shape))


def where(op) -> str:
    return f'{op["file"]}:{op["line"]}' if op.get('file') else op['name']


def check(side, start, target: str) -> str | None:
    """None where `side`'s program for `target` reduces every gradient as the plan says;
    else its first wrongs, one per line (at most five, and how many more)."""
    ops = compiled_ops(side, start, target)
    mesh = targets.mesh_on(side.mesh, targets.devices(target))
    grads = leaves(side.plan, start.state.params, mesh)
    written = side.name not in PARTITIONED
    own = lambda op: written and op['phase'] == 'backward' and op['file'].startswith(LAYERS)  # noqa: E731
    found = wrong(ops, grads, lambda shape: activation(shape, side.plan, start), written, own)
    if not found:
        return None
    more = f'\n... and {len(found) - 5} more' if len(found) > 5 else ''
    return f'the program compiled for {target}: ' + '\n'.join(found[:5]) + more
