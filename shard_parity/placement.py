"""Where each array lives: one rule per mesh axis, composed, for every twin and strategy.

    stage   a stacked block array's layer dimension              P('stage')
    expert  an expert weight's expert dimension                  P(None, 'expert') of [L, E, ...]
    model   Megatron's plan (below)                              P(None, 'model'), P('model', None)
    fsdp    the first dimension still free that it divides       P('fsdp'), P('model', 'fsdp')
    data, seq: no array is split; they split the batch (rows, positions); with ZeRO-1
            (--shard_optimizer_over_data) 'data' splits AdamW's moments (`by_data`)

The rules apply in that order to each array (`spec`), each only where the plan uses its axis
(shard_parity/plan.py): dp uses none (every array whole, P()), fsdp only fsdp's, fsdp_tp
model's then fsdp's, and the composed step all of them. Every function here takes the plan the
step runs (`state_specs(params, plan, mesh)`), never rebuilds it from a mesh.

Tensor parallelism pairs a column-parallel layer (its output features split over 'model': each
device computes some of them, no communication) with a row-parallel one (its input features
split the same way: each device computes a partial sum of every output, and one all-reduce adds
them). In attention the column split falls between heads, so each device runs whole heads; a
mixture of experts' up and down weights are split the same way, inside each expert.

The transformer's blocks are stacked (shard_parity/model/transformer.py): `blocks.*` arrays have a
leading [L] layer dimension, which only 'stage' splits: the other rules apply to the dimensions
after it (fsdp splits a stacked kernel f32[L, C, 4C] as P(None, 'fsdp'), so that every device
holds 1/n of every layer and a scan over the layers gathers one layer at a time).

The batch: its rows split over the row axes the plan uses ('data', 'fsdp', 'expert', in mesh
order), and under 'seq' each row's positions too (the strategy files reorder and split them).
"""

import jax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from shard_parity import plan as plans
from shard_parity.plan import Plan
from shard_parity.model.mlp import TP_PLAN
from shard_parity.model.ring import reorder
from shard_parity.plan import DATA, EXPERT, FSDP, MODEL, SEQ, STAGE, STRATEGIES  # noqa: F401

BATCH = P(DATA)  # split the leading (example) dimension across the 'data' axis
FSDP_BATCH = P(FSDP)  # fsdp: the rows split over the same axis as the state
SEQUENCE = P(DATA, SEQ)  # cp: rows across 'data', each row's positions across 'seq'
REPLICATED = P()  # no axis named: every device holds the whole array

STACKED = 'blocks'  # the transformer's stacked blocks: arrays with a leading [L] layer dimension
COLUMN = ('query', 'key_value', 'up')  # transformer layers whose outputs are split
ROW = ('out', 'down')  # ...and the layers that take those split features in
EXPERTS = 'experts'  # the MoE layers' stacked expert weights, [E, ...] (shard_parity/model/moe.py)


def layer_dims(path) -> int:
    """1 for an array of the stacked blocks (its leading dimension is the layer), else 0."""
    return int(any(getattr(k, 'key', None) == STACKED for k in path))


def is_expert(path) -> bool:
    """Whether a parameter's (or its optimizer moment's) tree path is an MoE layer's experts'."""
    return any(getattr(k, 'key', None) == EXPERTS for k in path)


def tp_role(path) -> str | None:
    """'column', 'row' or None, from a parameter's (or its optimizer moment's) tree path."""
    keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
    if len(keys) >= 2 and keys[-2] == EXPERTS:  # an expert's up f32[E, C, 4C], down [E, 4C, C]
        return 'column' if keys[-1] in COLUMN else 'row' if keys[-1] in ROW else None
    if len(keys) < 2 or keys[-1] not in ('kernel', 'bias'):
        return None
    if keys[-2] in COLUMN:
        return 'column'
    if keys[-2] in ROW:
        return 'row'
    if len(keys) >= 3 and keys[-3] == 'layers':
        return TP_PLAN.get(keys[-2])
    return None


# --- One rule per axis: each fills the dimensions it splits in `dims` (None: free).


def by_stage(path, shape, dims, n):  # pipeline stages: layers i L/S .. (i+1) L/S - 1 on stage i
    if layer_dims(path):
        dims[0] = STAGE


def by_expert(path, shape, dims, n):  # each device of the expert axis holds E/n whole experts
    if is_expert(path):
        dims[layer_dims(path)] = EXPERT


def by_model(path, shape, dims, n):  # Megatron: column kernels [in, out/m], row [in/m, out]
    role, matrix = tp_role(path), len(shape) - layer_dims(path) - is_expert(path) == 2
    if role == 'column':  # kernel [in, out/m], bias [out/m]
        dims[-1] = MODEL
    elif role == 'row' and matrix:  # kernel [in/m, out]; its bias is added after the all-reduce
        dims[-2] = MODEL


def by_fsdp(path, shape, dims, n, axis=FSDP):
    """'fsdp' on the first dimension after the layer dimension that the other axes leave free
    and n divides (else the array stays whole: a bias of odd size, a scalar). ZeRO-1 puts
    'data' on an optimizer moment the same way (`spec`'s `moment`)."""
    for i in range(layer_dims(path), len(shape)):
        if dims[i] is None and shape[i] % n == 0 and shape[i] >= n:
            dims[i] = axis
            return


RULES = ((STAGE, by_stage), (EXPERT, by_expert), (MODEL, by_model), (FSDP, by_fsdp))


def spec(path, shape, plan, moment=False) -> P:
    """One array's PartitionSpec under `plan`: each used axis's rule, in RULES' order; a
    `moment` (AdamW's state, and the gradient it takes) under ZeRO-1 split over 'data' too."""
    dims = [None] * len(shape)
    for axis, rule in RULES:
        if plan.uses(axis):
            rule(path, shape, dims, plan.size(axis))
    if moment and plan.zero1:  # ZeRO-1: each 'data' device updates 1/n of it (docs/zero1.md)
        by_data(path, shape, dims, plan.size(DATA), plan.size(FSDP))
    return P(*dims)


def by_data(path, shape, dims, n, f):
    """ZeRO-1's 'data' on a moment: under fsdp beside it on its dimension, ('fsdp', 'data'),
    where f x n divides it (each fsdp shard split again: an embedding's gradient constrained to
    P('fsdp', 'data') instead had auto's partitioner replicate an activation to reshard it);
    else on the first free dimension it divides, as fsdp's rule."""
    if FSDP in dims and shape[dims.index(FSDP)] % (f * n) == 0:
        dims[dims.index(FSDP)] = (FSDP, DATA)
    else:
        by_fsdp(path, shape, dims, n, DATA)


def splits(spec: P, axis: str) -> int | None:
    """The dimension `spec` splits over `axis` (alone or in a tuple), else None."""
    named = [d if isinstance(d, tuple) else (d,) for d in spec]
    return next((i for i, d in enumerate(named) if axis in d), None)


def in_opt_state(path) -> bool:
    """Whether a TrainState's tree path is in its optimizer state (AdamW's moments, count)."""
    return bool(path) and getattr(path[0], 'name', None) == 'opt_state'


def state_specs(state, plan: Plan, mesh):
    """The PartitionSpec of every array in `state` (params, optimizer state, step) under
    `plan` on `mesh` (the plan's mesh, in the twin's axis types)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: as_returned(
            spec(path, x.shape, plan, in_opt_state(path)), len(x.shape), mesh
        ),
        state,
    )


def update_specs(params, plan: Plan, mesh):
    """Where the update happens: the specs of the moments of `params` (a tree of the params'
    shape: the gradients, the params themselves). Under ZeRO-1 each array's first free
    dimension that 'data' divides is split over it (`unsplit` lists those with none); else
    the params' own specs."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: as_returned(spec(path, x.shape, plan, True), len(x.shape), mesh), params
    )


def unsplit(params, plan: Plan) -> list[str]:
    """ZeRO-1's leftovers: the params whose moments no 'data' split fits (no free dimension
    that 'data' divides), kept whole on every device and updated there: their names."""
    if not plan.zero1:
        return []
    return [
        jax.tree_util.keystr(path)
        for path, x in jax.tree_util.tree_flatten_with_path(params)[0]
        if splits(spec(path, x.shape, plan, True), DATA) is None
    ]


def as_returned(spec: P, ndim: int, mesh) -> P:
    """`spec` spelled as a jitted step spells its outputs' sharding, so that the state the step
    returns matches the one it took and its second call reuses the first one's compilation: on
    an Explicit mesh (typed/) every dimension is named (P(None, None): P() is another type
    there); on an Auto mesh trailing Nones are dropped (P('model'), not P('model', None))."""
    dims = [*spec, *(None,) * (ndim - len(spec))]
    if AxisType.Explicit not in mesh.axis_types:
        while dims and dims[-1] is None:
            dims.pop()
    return P(*dims)


def mesh_axes(strategy: str) -> tuple[str, str]:
    """The names of --mesh=AxB's two numbers for `strategy` (shard_parity/plan.py)."""
    return plans.TWO_AXES[strategy]


def rows(plan: Plan) -> P:
    """The batch's layout under `plan`: its rows over the row axes it uses."""
    axes = plan.rows
    return P(axes[0] if len(axes) == 1 else axes or None)


def in_layout(batch, plan: Plan):
    """The batch with each row's positions in --cp_layout's order under 'seq' (`reorder`: a
    local gather of whole rows), so that splitting them over 'seq' gives each device its own
    positions; as it is without 'seq'."""
    return reorder(batch, plan.size(SEQ), plan.layout) if plan.uses(SEQ) else batch


def activations(plan: Plan) -> tuple:
    """Where auto/ and typed/ keep a transformer's activations x [B, T, C] under `plan` (a pp or
    ep mesh, or a named one's every axis): the rows over the row axes, under 'seq' the
    positions."""
    rows = plan.rows[0] if len(plan.rows) == 1 else plan.rows or None
    return (rows, SEQ) if plan.uses(SEQ) else (rows,)


def expert_slots(plan: Plan) -> P:
    """[E, B, cap, C], the experts' slots by expert: E/n experts' slots on each device of the
    expert axis, of the rows of its other row axes (ep's P('expert', 'data'))."""
    others = tuple(a for a in plan.rows if a != EXPERT)
    return P(EXPERT, others[0] if len(others) == 1 else others or None)


def row_slots(plan: Plan) -> P:
    """[E, B, cap, C], the experts' slots by row: every expert's slots of this device's rows
    (ep's P(None, ('data', 'expert')))."""
    return P(None, plan.rows)


def state_shardings(state, mesh, plan: Plan):
    """`state_specs` as NamedShardings on `mesh`: where Orbax restores and jit keeps each array."""
    return named(mesh, state_specs(state, plan, mesh))


def update_shardings(params, mesh, plan: Plan):
    """`update_specs` as NamedShardings on `mesh`: where ZeRO-1's update runs."""
    return named(mesh, update_specs(params, plan, mesh))


def named(mesh, specs):
    """A PartitionSpec, or a tree of them, as NamedShardings on `mesh`."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs)


def reduced_shardings(params, mesh, plan: Plan, gathered: bool = False):
    """`reduced_specs` as NamedShardings on `mesh`."""
    return named(mesh, reduced_specs(params, mesh, plan, gathered))


def reduced_specs(params, mesh, plan: Plan, gathered: bool = False):
    """typed/'s layout of the params inside a step (JAX's Explicit mode): `plan`'s (with
    `gathered`, without 'fsdp': FSDP's weights once gathered), with each matrix also `reduced`
    over the axes that split the batch. Reduced is a type, not a move: the array is whole on
    every such device, as replicated; but its gradient comes out `unreduced` (each device's
    partial sum), for the strategy to add once. Vectors (biases, LayerNorm scales) stay
    replicated: jax (0.10 to 0.12 at least) refuses a reduced operand beside one split on the
    same axis in an elementwise op (x + b), so their gradients are summed where they are formed.
    Not over an axis the array itself is split over (an expert's, over 'expert'), and an MoE
    layer's (router, experts) not over 'seq': the routing runs on whole sequences (model/moe.py),
    so no 'seq' split enters their contractions (a seq axis beside experts is of size 1)."""
    axes = set(plan.batch_axes)
    split = axes if any(mesh.shape[a] > 1 for a in axes) else set()
    specs = state_specs(params, plan, mesh)
    if gathered:
        specs = without(specs, FSDP)

    def cast(path, x, spec):  # a matrix: 2 dimensions after a stacked array's layer dimension
        matrix = x.ndim - layer_dims(path) >= 2
        partial = reduced_over(path, split) - set(spec)  # not over an axis it is split over
        return P(*spec, reduced=partial) if matrix and partial else spec

    return jax.tree_util.tree_map_with_path(cast, params, specs)


def reduced_over(path, axes) -> set:
    """Which of the batch axes `axes` typed/ makes the array at `path` `reduced` over: all, but
    'seq' for an MoE layer's router and experts, whose routing runs on whole sequences
    (model/moe.py), so that no 'seq' split enters their contractions (a seq axis beside experts
    is of size 1: more is refused)."""
    moe = any(getattr(k, 'key', None) in ('router', EXPERTS) for k in path)
    return set(axes) - {SEQ} if moe else set(axes)


def layer_specs(specs):
    """One layer's specs: the stacked blocks' without their layer dimension; None without
    stacked blocks (the MLP, whose FSDP gathers every weight once, at the top of the step)."""
    if STACKED not in specs:
        return None
    return jax.tree.map(lambda s: P(*s[1:]), specs[STACKED], is_leaf=lambda s: isinstance(s, P))


def without(specs, axis: str):
    """A PartitionSpec, or a tree of them, split over `axis` no more: without FSDP, an FSDP
    shard's layout once gathered (dp's; tp's under fsdp_tp)."""
    return jax.tree.map(lambda spec: P(*(None if d == axis else d for d in spec)), specs)


def outside_layers(fn, tree, *rest, **options):
    """`fn(x, *r, **options)` on every array of `tree` outside the stacked blocks (embeddings,
    final norm: what FSDP gathers once per step); the blocks' arrays as they are (gathered per
    layer)."""
    return jax.tree_util.tree_map_with_path(
        lambda p, x, *r: x if layer_dims(p) else fn(x, *r, **options), tree, *rest
    )


def place_state(state, mesh, plan: Plan):
    """Params and optimizer state to the devices, split as `plan` splits them."""
    return jax.device_put(state, state_shardings(state, mesh, plan))


def place_batch(batch, mesh, plan: Plan):
    """This process's rows of a batch -> global arrays split over the row axes. With one process
    those rows are the whole batch; with several, each loads only its own part."""
    sharding = NamedSharding(mesh, rows(plan))
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)
