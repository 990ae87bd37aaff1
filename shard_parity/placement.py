"""Where each array lives, per strategy: one rule that both twins use, and the placing itself.

    dp       every array whole on every device               P()
    fsdp     split on its first dimension over 'data'         P('data')
    tp       Megatron's plan over 'model' (below), or whole   P(None, 'model'), P('model', None)
    fsdp_tp  tp's spec, plus 'data' on the first free dim     P('data', 'model'), P('model', 'data')
    cp       every array whole, as dp; on a DATA x SEQ mesh   P()   (tokens: P('data', 'seq'))
    pp       the stacked blocks' layer dim over 'stage'       P('stage'), the rest P()
    ep       the experts' weights split over 'expert', the     P(None, 'expert') (stacked [L, E, ...])
             rest whole; on a DATA x EXPERT mesh              (the batch: P(('data', 'expert')))

Tensor parallelism pairs a column-parallel layer (its output features split over 'model': each
device computes some of them, no communication) with a row-parallel one (its input features
split the same way: each device computes a partial sum of every output, and one all-reduce adds
them). In attention the column split falls between heads, so each device runs whole heads.

The transformer's blocks are stacked (shard_parity/model/transformer.py): `blocks.*` arrays have a
leading [L] layer dimension, which no strategy but pp splits: each spec above applies to the dimensions
after it (fsdp splits a stacked kernel f32[L, C, 4C] as P(None, 'data'), so that every device
holds 1/n of every layer and a scan over the layers gathers one layer at a time).

Context parallelism splits each sequence instead: its mesh's second axis is SEQ, not MODEL
(`mesh_axes`), and its tokens are placed SEQUENCE, rows over 'data' and positions over 'seq'.
"""

import jax
from absl import logging
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from shard_parity import UsageError
from shard_parity.mesh import DATA, EXPERT, MODEL, SEQ, STAGE
from shard_parity.model.mlp import TP_PLAN

STRATEGIES = (
    'dp',
    'fsdp',
    'tp',
    'fsdp_tp',
    'cp',
    'pp',
    'ep',
)  # each twin has one file per name: <twin>/<name>.py
BATCH = P(DATA)  # split the leading (example) dimension across the 'data' axis
SEQUENCE = P(DATA, SEQ)  # cp: rows across 'data', each row's positions across 'seq'
REPLICATED = P()  # no axis named: every device holds the whole array
EXPERT_BATCH = P((DATA, EXPERT))  # ep: the rows split over both axes, d x n ways

STACKED = 'blocks'  # the transformer's stacked blocks: arrays with a leading [L] layer dimension
COLUMN = ('query', 'key_value', 'up')  # transformer layers whose outputs are split
ROW = ('out', 'down')  # ...and the layers that take those split features in
EXPERTS = 'experts'  # the MoE layers' stacked expert weights, [E, ...] (shard_parity/model/moe.py)


def layer_dims(path) -> int:
    """1 for an array of the stacked blocks (its leading dimension is the layer), else 0."""
    return int(any(getattr(k, 'key', None) == STACKED for k in path))


def tp_role(path) -> str | None:
    """'column', 'row' or None, from a parameter's (or its optimizer moment's) tree path."""
    keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
    if len(keys) < 2 or keys[-1] not in ('kernel', 'bias'):
        return None
    if keys[-2] in COLUMN:
        return 'column'
    if keys[-2] in ROW:
        return 'row'
    if len(keys) >= 3 and keys[-3] == 'layers':
        return TP_PLAN.get(keys[-2])
    return None


def tp_spec(path, x) -> P:
    role, stacked = tp_role(path), (None,) * layer_dims(path)  # never split the layer dim
    is_kernel = x.ndim - len(stacked) == 2
    if role == 'column':  # kernel [in, out/m], bias [out/m]
        return P(*stacked, None, MODEL) if is_kernel else P(*stacked, MODEL)
    if role == 'row' and is_kernel:  # kernel [in/m, out]; its bias is added after the all-reduce
        return P(*stacked, MODEL, None)
    return P()


def is_expert(path) -> bool:
    """Whether a parameter's (or its optimizer moment's) tree path is an MoE layer's experts'."""
    return any(getattr(k, 'key', None) == EXPERTS for k in path)


def ep_spec(path, x) -> P:
    """ep: an expert weight ([L, E, ...] under the stacked blocks) split on E over 'expert'."""
    return P(*(None,) * layer_dims(path), EXPERT) if is_expert(path) else P()


def fsdp_spec(shape: tuple[int, ...], n: int, taken: P = P(), skip: int = 0) -> P:
    """Adds 'data' to the first dimension after the first `skip` (the layer dimension of a
    stacked array) that `taken` leaves free and n divides (else leaves the array as it is: a
    bias of odd size, a scalar)."""
    dims = list(taken) + [None] * (len(shape) - len(taken))
    for i, size in enumerate(shape):
        if i >= skip and dims[i] is None and size % n == 0 and size >= n:
            dims[i] = DATA
            break
    while dims and dims[-1] is None:
        dims.pop()
    return P(*dims)


def state_specs(state, strategy: str, mesh):
    """The PartitionSpec of every array in `state` (params, optimizer state, step)."""
    n = mesh.shape[DATA]
    rules = {
        'dp': lambda path, x: P(),
        'fsdp': lambda path, x: fsdp_spec(x.shape, n, skip=layer_dims(path)),
        'tp': tp_spec,
        'fsdp_tp': lambda path, x: fsdp_spec(x.shape, n, tp_spec(path, x), layer_dims(path)),
        'cp': lambda path, x: P(),
        'pp': pp_spec,
        'ep': ep_spec,
    }
    return jax.tree_util.tree_map_with_path(
        lambda path, x: as_returned(rules[strategy](path, x), len(x.shape), mesh), state
    )


def pp_spec(path, x) -> P:
    """Pipeline parallelism: a stacked block array's layer dimension split over 'stage' (stage
    i holds layers i L/S .. (i+1) L/S - 1), everything else whole, as dp."""
    return P(STAGE) if layer_dims(path) else P()


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
    """The mesh's axis names for `strategy`: context parallelism's second axis splits the
    sequence ('seq'), pipeline parallelism's the layers into stages ('stage'), expert
    parallelism's the experts ('expert'); every other strategy's splits layers ('model'), or
    holds copies."""
    second = {'cp': SEQ, 'pp': STAGE, 'ep': EXPERT}.get(strategy, MODEL)
    return DATA, second


def state_shardings(state, mesh, strategy: str):
    """`state_specs` as NamedShardings on `mesh`: where Orbax restores and jit keeps each array."""
    return named(mesh, state_specs(state, strategy, mesh))


def named(mesh, specs):
    """A PartitionSpec, or a tree of them, as NamedShardings on `mesh`."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs)


def reduced_shardings(params, mesh, strategy: str):
    """typed/'s layout of the params inside a step (JAX's Explicit mode): `strategy`'s, with each
    matrix also `reduced` over 'data'. Reduced is a type, not a move: the array is whole on every
    'data' device, as replicated; but its gradient comes out `unreduced` (each device's partial
    sum), for the strategy to add once. Vectors (biases, LayerNorm scales) stay replicated: jax
    (0.10 to 0.12 at least) refuses a reduced operand beside one split on the same axis in an
    elementwise op (x + b), so their gradients are summed where they are formed. Under cp the
    batch is split over 'seq' too, so the gradients are partial over both axes; under ep over
    'expert' too, but for the experts' own, which are split over it (partial over 'data')."""
    axes = {'cp': {DATA, SEQ}, 'ep': {DATA, EXPERT}}.get(strategy, {DATA})  # the batch's axes
    split = axes if any(mesh.shape[a] > 1 for a in axes) else set()

    def cast(path, x, spec):  # a matrix: 2 dimensions after a stacked array's layer dimension
        matrix = x.ndim - layer_dims(path) >= 2
        partial = split - set(spec)  # not over an axis the array itself is split over
        return P(*spec, reduced=partial) if matrix and partial else spec

    specs = jax.tree_util.tree_map_with_path(cast, params, state_specs(params, strategy, mesh))
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs)


def layer_specs(specs):
    """One layer's specs: the stacked blocks' without their layer dimension; None without
    stacked blocks (the MLP, whose FSDP gathers every weight once, at the top of the step)."""
    if STACKED not in specs:
        return None
    return jax.tree.map(lambda s: P(*s[1:]), specs[STACKED], is_leaf=lambda s: isinstance(s, P))


def without(specs, axis: str):
    """A PartitionSpec, or a tree of them, split over `axis` no more: without DATA, an FSDP
    shard's layout once gathered (dp's; tp's under fsdp_tp)."""
    return jax.tree.map(lambda spec: P(*(None if d == axis else d for d in spec)), specs)


def outside_layers(fn, tree, *rest):
    """`fn(x, *r)` on every array of `tree` outside the stacked blocks (embeddings, final norm:
    what FSDP gathers once per step); the blocks' arrays as they are (gathered per layer)."""
    return jax.tree_util.tree_map_with_path(
        lambda p, x, *r: x if layer_dims(p) else fn(x, *r), tree, *rest
    )


def place_state(state, mesh, strategy: str):
    """Params and optimizer state to the devices, split as `strategy` splits them."""
    return jax.device_put(state, state_shardings(state, mesh, strategy))


def place_batch(batch, mesh):
    """This process's rows of a batch -> global arrays split over 'data'. With one process
    those rows are the whole batch; with several, each loads only its own part."""
    sharding = NamedSharding(mesh, BATCH)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)


def check_tp(model_config, mesh) -> None:
    """Tensor parallelism splits heads and hidden features over 'model': they must divide."""
    m = mesh.shape[MODEL]
    sizes = (
        {'--num_heads': model_config.num_heads, '--num_kv_heads': model_config.num_kv_heads}
        if hasattr(model_config, 'num_heads')
        else {'the hidden layer width': model_config.layer_sizes[1]}
    )
    for name, size in sizes.items():
        if size % m:
            raise UsageError(
                f'{name}={size} is not divisible by the mesh\'s model axis ({m}): tensor '
                f'parallelism gives each of the {m} devices of a model group an equal share; '
                f'use a --mesh whose MODEL divides {size}'
            )


def check_cp(model_config, mesh, layout='zigzag') -> None:
    """Context parallelism splits a transformer's sequence over 'seq' into equal chunks: n of
    them, or 2n in the zigzag layout (shard_parity/model/ring.py)."""
    n = mesh.shape[SEQ]
    if not hasattr(model_config, 'seq_len'):
        raise UsageError(
            '--strategy=cp splits sequences, and --model=mlp has none: use --model=transformer, '
            'or another --strategy (dp, fsdp, tp, fsdp_tp) for the MLP'
        )
    if model_config.seq_len % n:
        fits = next(k for k in range(n, 0, -1) if model_config.seq_len % k == 0)
        raise UsageError(
            f"--seq_len={model_config.seq_len} is not divisible by the mesh's sequence axis "
            f'({n}): each of its devices holds seq_len/{n} positions; use a multiple of {n}, '
            f'or a --mesh whose second number divides {model_config.seq_len} (e.g. {fits})'
        )
    if layout == 'zigzag' and model_config.seq_len % (2 * n):
        raise UsageError(
            f'--seq_len={model_config.seq_len} is not divisible by 2 x the sequence axis '
            f'({2 * n}): the zigzag layout gives each of the {n} devices two chunks of '
            f'seq_len/{2 * n} positions; use a multiple of {2 * n}, or --cp_layout=contiguous'
        )
    if n == 1:
        logging.warning(
            "--strategy=cp on a sequence axis of 1 (--mesh=%dx1) splits no sequence: it runs "
            'as dp; give the second number of --mesh to split each sequence that many ways',
            mesh.shape[DATA],
        )


def check_ep(model_config, mesh) -> None:
    """Expert parallelism gives each of the n devices of the 'expert' axis E/n whole experts."""
    n, e = mesh.shape[EXPERT], getattr(model_config, 'num_experts', 0)
    if not e:
        raise UsageError(
            '--strategy=ep splits the experts of a mixture-of-experts transformer: use '
            '--model=transformer --num_experts=E (a multiple of the mesh\'s expert axis)'
        )
    if e % n:
        raise UsageError(
            f"--num_experts={e} is not divisible by the mesh's expert axis ({n}): each of its "
            f'devices holds num_experts/{n} whole experts; use a multiple of {n}, or a --mesh '
            f'whose second number divides {e}'
        )
