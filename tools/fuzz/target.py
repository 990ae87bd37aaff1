"""The fuzzer's compile-only check (python -m tools.fuzz --target=tpu-v5e-8): each draw's train
step compiled for a TPU slice with libtpu, from shapes alone (nothing runs), and its
collectives held to what the plan's axes say of every gradient.

The inspector does the compiling and the reading (inspector/target.py: the slice's devices;
inspector/program.py's analyse: each collective's kind, mesh axes, phase and operand shapes).
What each gradient leaf must be reduced over comes from the plan (inspector/records.py's
`averaged_over`: the batch axes it is not split over, 'fsdp' by its reduce-scatter) and the
schedule (1F1B and interleaved all-reduce the gradients outside the blocks over 'stage': each
stage holds its own copy of them, and only the first and last use theirs). The embeddings'
gradients may also be reduced over 'model' and 'stage': they are the blocks' input cotangent,
which tensor parallelism leaves partial over 'model' and a pipeline holds on its first stage
alone, looked up (a linear map), so it may be summed before the lookup (explicit/ writes it so)
or after it (auto/'s partitioner, on a TPU).

Which collective is whose, the program's dataflow says (inspector/dataflow.py): a reduction is a
leaf's gradient's when its result reaches that leaf's update (the new parameter or its AdamW
moments, by the entry's result tuple) through ops that carry it element by element, not through
a dot or a reduction that forms a gradient from an activation; an all-gather gathers a leaf when
its operand is that entry parameter, moved, sliced or cast. Then:

    every reduction of a gradient runs over axes the plan allows for that leaf (so none over
        'model' but the embeddings', nor over 'stage' outside 1F1B's non-block leaves);
    each leaf is reduced over every axis the plan says, by one op or several (in a twin that
        writes its collectives: the partitioner may gather activations instead);
    no all-gather over 'expert' of an expert's weights (each device keeps its own experts);
    under --gradient_accumulation_steps, in a twin that writes its collectives, each gradient
        reduced over 'data' once a step, not once per microbatch (`in_loop`).
"""

import math
import re

import jax
from flax import nnx

from shard_parity.inspector import target as targets
from shard_parity.inspector.dataflow import callee, operand_of, origin, outputs_reached
from shard_parity.inspector.hlo_module import Module
from shard_parity.inspector.program import analyse
from shard_parity.inspector.records import Array, averaged_over
from shard_parity.inspector.twins import model_and_batch, with_sharding
from shard_parity.mesh import DATA, EXPERT, FSDP, MODEL, STAGE
from shard_parity.placement import is_expert, layer_dims, rows, state_shardings, state_specs
from shard_parity.step import create_state

REDUCTIONS = ('all-reduce', 'reduce-scatter')
PARTITIONED = ('auto', 'typed')  # twins whose collectives the partitioner places
PER_LEAF_STAGE = ('1f1b', 'interleaved')  # schedules that reduce the non-block leaves over 'stage'
EMBEDDINGS = ("['embed']", "['pos']")  # the transformer's lookups: the blocks' input
# an entry parameter's name: the step's argument path (a TrainState's .params, or a dict's)
PARAM = re.compile(r"parameter\(\d+\).*op_name=\"state(?:\.params|\['params'\])(?P<path>[^\"]*)\"")


def compiled_ops(side, start, target: str) -> list[dict]:
    """The collectives of `side`'s train step for the draw `start` (tools.bisect.started),
    compiled for `target`'s devices (nothing runs): inspector.program.analyse's ops, each with
    'leaves' (per operand, the parameters whose update its result reaches) and 'gathers' (the
    parameter an all-gather's operand is)."""
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
    ops = analyse(compiled, mesh, chosen.hardware, (), chosen)['ops']
    params = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(state.params)]
    return read(Module(compiled.as_text()), ops, updated(compiled.out_tree, params))


def updated(out_tree, params) -> dict:
    """{index in the step's result: the parameter it updates} for each new parameter and each
    of its AdamW moments (their paths end with the parameter's)."""
    n = out_tree.num_leaves
    paths = jax.tree_util.tree_leaves_with_path(jax.tree_util.tree_unflatten(out_tree, range(n)))
    out = {}
    for path, index in paths:
        text = jax.tree_util.keystr(path)
        ends = [p for p in params if text.endswith(p)]
        if ends:
            out[index] = max(ends, key=len)
    return out


def read(module: Module, ops: list[dict], outputs: dict) -> list[dict]:
    """`ops` with 'leaves' and 'gathers' (compiled_ops) read from the program's dataflow."""
    for op in ops:
        i = module.instructions.get(op['name'])
        n = len(op['shapes'])
        op['leaves'], op['gathers'] = [set() for _ in range(n)], None
        if i is None:
            continue
        if op['kind'] in REDUCTIONS:
            op['leaves'] = reached(module, i, n, outputs)
        elif op['kind'] == 'all-gather':
            op['gathers'] = gathered(module, i)
    return ops


def reached(module: Module, i, n: int, outputs: dict) -> list[set]:
    """Per operand of the reduction `i` (n of them; XLA combines several into a tuple), the
    parameters (`outputs`: `updated`'s) whose update its result reaches."""
    tuple_valued = n > 1 and i.type.startswith('(')
    found = [outputs_reached(module, i, e if tuple_valued else None) for e in range(n)]
    return [{outputs[j] for j in each if j in outputs} for each in found]


def gathered(module: Module, i) -> str | None:
    """The parameter's path (`['w']`) the all-gather `i` gathers, by its entry parameter's
    name, or None where it gathers something computed."""
    if i.opcode == 'fusion':  # a TPU's async chain: the gather inside its start
        inner = module.computations.get(callee(i), [])
        i = next((j for j in inner if j.opcode.startswith('all-gather')), i)
    source = origin(module, operand_of(module, i, 0)) if i.operands else None
    m = PARAM.search(source.line.replace("\\'", "'")) if source is not None else None
    return m.group('path') if m else None


def leaves(plan, params, mesh) -> list[dict]:
    """Each parameter's gradient: its path, the axes it must be reduced over, those it may be,
    and whether it is an expert's weights split over 'expert'."""
    specs = jax.tree.leaves(state_specs(params, plan, mesh))
    out = []
    pairs = zip(jax.tree_util.tree_leaves_with_path(params), specs, strict=True)
    for (path, p), spec in pairs:
        split = [tuple(d if isinstance(d, tuple) else (d,)) if d else () for d in spec]
        axes = tuple(a for d in split for a in d)
        stacked = bool(layer_dims(path))
        plan_says = averaged_over(plan, Array(0, axes, stacked, is_expert(path)))
        must = [a for a in plan_says if plan.size(a) > 1]  # over an axis of 1: nothing to do
        may = set(plan_says) | ({FSDP} if plan.uses(FSDP) else set())
        if not stacked and plan.uses(STAGE) and plan.schedule in PER_LEAF_STAGE:
            may |= {STAGE}
        key = jax.tree_util.keystr(path)
        # the blocks' input cotangent, summed after the lookup (auto/'s partitioner), or before
        # it, which reads as after it where a device holds one row: XLA makes the sum over
        # rows that forms the position table's gradient a reshape, and the walk goes through
        if key.startswith(EMBEDDINGS):
            may |= {a for a in (MODEL, STAGE) if plan.uses(a)}
        out.append({'path': key, 'must': set(must), 'may': may,
                    'expert': is_expert(path) and EXPERT in axes})  # fmt: skip
    return out


def wrong(ops, grads, written: bool = True) -> list[str]:
    """What breaks the rules above, one line each (none: the program is as the plan says).
    Each op carries 'leaves' (per operand: the parameters whose update its result reaches) and
    'gathers' (an all-gather's parameter), as `read` finds them. `written`: the twin writes its
    collectives (explicit/, a module of yours), so a leaf never reduced over an axis it must be
    is wrong; where the partitioner places them (auto/, typed/) it may gather the activations
    over the batch axes instead and make each gradient whole where it is used (measured: auto/
    and typed/ on data:2,stage:4; auto/'s experts on data:8)."""
    out, reduced = [], {g['path']: set() for g in grads}
    by_path = {g['path']: g for g in grads}
    for op in ops:
        axes = set(op['axes'] or ())
        if op['kind'] in REDUCTIONS and op['phase'] != 'forward':  # the forward's: activations'
            for shape, paths in zip(op['shapes'], op['leaves']):
                mine = [by_path[p] for p in sorted(paths) if p in by_path]
                for g in mine:
                    reduced[g['path']] |= axes
                    if not axes <= g['may']:
                        may = '/'.join(sorted(g['may'])) or 'nothing'
                        out.append(f'{op["kind"]} over {"/".join(sorted(axes))} at {where(op)} '
                                   f'reduces the gradient of {g["path"]} {list(shape)}, which '
                                   f'the plan reduces over {may}')  # fmt: skip
        gathered = by_path.get(op.get('gathers') or '')
        if op['kind'] == 'all-gather' and EXPERT in axes and gathered and gathered['expert']:
            out.append(f"all-gather over 'expert' at {where(op)} gathers {gathered['path']}, an "
                       "expert's weights (each device keeps its own experts)")  # fmt: skip
    for g in grads if written else []:
        missing = g['must'] - reduced[g['path']]
        if missing:
            out.append(f'the gradient of {g["path"]} is never reduced over '
                       f'{"/".join(sorted(missing))}, as the plan says it must be')  # fmt: skip
    return out


def in_loop(ops, grads) -> list[str]:
    """Under K > 1 (--gradient_accumulation_steps), in a twin that writes its collectives: no
    gradient reduced over 'data' inside a loop, once per microbatch, where it belongs once a
    step, after the K microbatches (tools.zoo.accum_reduced_in_loop: the same values, K
    all-reduces). A reduction over 'data' of more than one element whose result reaches a
    parameter's update, with a loop trip count above 1. Not one over 'fsdp' too (FSDP's
    reduce-scatter runs per layer in the backward, so per microbatch, in every twin:
    docs/accumulation.md), nor a scalar's (the clip's norm, the loss). How many ops reduce a
    leaf is no measure: XLA splits a reduction's tuple (explicit/ under ZeRO-1 all-reduces the
    MLP's biases twice, trip count 1, with K = 1 too), and it adds two all-reduces of an
    unrolled loop into one (the zoo's entry at K = 2 compiled for tpu-v5e-8: one, once)."""
    out = []
    for op in ops:
        axes, trips = set(op['axes'] or ()), op.get('trip_count') or 1
        if op['kind'] not in REDUCTIONS or op['phase'] == 'forward' or trips < 2:
            continue
        if FSDP in axes or DATA not in axes:
            continue
        for shape, paths in zip(op['shapes'], op['leaves']):
            for path in sorted(paths & {g['path'] for g in grads}) if math.prod(shape) > 1 else ():
                out.append(f'{op["kind"]} over data at {where(op)} reduces the gradient of '
                           f'{path} {list(shape)} inside the accumulation loop ({trips} trips a '
                           'step, one per microbatch), where the plan reduces it once, after '
                           'the loop')  # fmt: skip
    return out


def where(op) -> str:
    return f'{op["file"]}:{op["line"]}' if op.get('file') else op['name']


def check(side, start, target: str) -> str | None:
    """None where `side`'s program for `target` reduces every gradient as the plan says;
    else its first wrongs, one per line (at most five, and how many more)."""
    ops = compiled_ops(side, start, target)
    mesh = targets.mesh_on(side.mesh, targets.devices(target))
    grads, written = leaves(side.plan, start.state.params, mesh), side.name not in PARTITIONED
    found = wrong(ops, grads, written)
    if written and start.config.gradient_accumulation_steps > 1:
        found += in_loop(ops, grads)
    if not found:
        return None
    more = f'\n... and {len(found) - 5} more' if len(found) > 5 else ''
    return f'the program compiled for {target}: ' + '\n'.join(found[:5]) + more
