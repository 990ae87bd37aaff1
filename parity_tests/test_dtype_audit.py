"""Claim: the inspector holds each collective's dtypes against the precision policy
(docs/numerics.md, "The dtype audit"): per operand its traffic (weight, gradient, activation,
metric), the dtype the policy wants, the dtype the step asked for (the partitioned program,
before the backend's passes) and the one the compiled program carries, naming the pass where
XLA:CPU carries bf16 in f32. A step that asks otherwise, or a compiler that narrows a float32
gradient, is a surprise (`--fail_on_surprise`). Pinned under --dtype=bfloat16 with either
--reduce_dtype for dp, fsdp, tp and data:2,fsdp:2,model:2 in all three twins on the CPU (the
table of docs/numerics.md), and fsdp compiled for a TPU; a planted module that reduces its
gradients in bf16 is caught; fsdp's gathers in bf16 move half float32's bytes."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from shard_parity import config as cfg
from shard_parity import auto, explicit, inspector, typed
from shard_parity import plan as plans
from shard_parity.devices import libtpu_installed
from shard_parity.inspector import policy, twins
from shard_parity.inspector import target as targets
from shard_parity.inspector.expect import expectation
from shard_parity.inspector.program import analyse, compile_all
from shard_parity.mesh import mesh_for
from shard_parity.placement import rows, state_shardings
from shard_parity.step import create_state, make_optimizer, strategy_file
from shard_parity.tools.zoo import reduce_bf16

SLOW = pytest.mark.slow
BF16 = plans.Precision(compute='bfloat16')
# the probe of docs/numerics.md: 2 layers of width 64, 4 heads, 32 positions, 16 rows
SHAPE = {'seq_len': 32, 'num_layers': 2, 'num_heads': 4, 'num_kv_heads': 4, 'embed_dim': 64}


def report(mesh: str, precision: plans.Precision, target=None, model='transformer') -> dict:
    """What `python -m inspector --json` prints for `mesh` under `precision`, in this process."""
    devices = targets.devices(target) if target else None
    plan = plans.parse(mesh, None, 8, precision=precision)
    dtypes = {'dtype': precision.compute, 'reduce_dtype': precision.reduce}
    model_config = (cfg.TransformerConfig(**SHAPE, **dtypes) if model == 'transformer'
                    else cfg.MLPConfig(**dtypes))  # fmt: skip
    config = cfg.TRAIN_DEFAULTS[model]
    config = dataclasses.replace(config, batch_size=16 if model == 'transformer' else 64)
    r = twins.inspect(model, config, mesh_for(plan, AxisType.Auto, devices=devices), plan,
                      model_config, target=target)  # fmt: skip
    return json.loads(json.dumps(r))


def table(r: dict) -> dict:
    """{twin: {traffic: 'asked>carried'}}: the dtypes of each traffic's operands, asked for and
    carried, '!' where some are off the policy."""
    out = {}
    for twin, found in r['dtypes'].items():
        merged = {}
        for row in found:
            asked, carried, off = merged.get(row['traffic'], (set(), set(), False))
            merged[row['traffic']] = (asked | set(row['asked']), carried | set(row['carried']),
                                      off or row['surprise'])  # fmt: skip
        out[twin] = {t: f"{','.join(sorted(a))}>{','.join(sorted(c))}" + '!' * off
                     for t, (a, c, off) in sorted(merged.items())}  # fmt: skip
    return out


def dtype_surprises(r: dict, twin: str) -> list[dict]:
    return [s for s in r['surprises'][twin] if s['kind'].startswith('dtype-')]


def test_xla_cpu_carries_bf16_collectives_in_f32_and_the_report_names_the_pass():
    """Each kind of collective written in bf16: the CPU's compiled program carries f32, the
    step asked bf16, and the pass that promoted it is named (measured pass by pass with
    --xla_dump_hlo_pass_re: all-reduce-promotion, then float-normalization-bf16)."""
    mesh = jax.make_mesh((8,), ('data',), axis_types=(AxisType.Auto,))
    ring = [(i, (i + 1) % 8) for i in range(8)]

    def body(x):  # x: bf16[8, 16], this device's rows
        return (jax.lax.psum(x, 'data').sum() + jax.lax.all_gather(x, 'data', tiled=True).sum()
                + jax.lax.ppermute(x, 'data', ring).sum()
                + jax.lax.psum_scatter(x, 'data', scatter_dimension=0, tiled=True).sum()
                + jax.lax.all_to_all(x, 'data', 0, 0, tiled=True).sum())  # fmt: skip

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P('data'), out_specs=P(), check_vma=False))
    x = jax.ShapeDtypeStruct((64, 16), jnp.bfloat16, sharding=NamedSharding(mesh, P('data')))
    ops = inspector.inspect(f, x).json()['programs']['program']
    passes = {'all-reduce': 'all-reduce-promotion', 'reduce-scatter': 'all-reduce-promotion',
              'all-gather': 'float-normalization-bf16', 'all-to-all': 'float-normalization-bf16',
              'collective-permute': 'float-normalization-bf16'}  # fmt: skip
    assert sorted(op['kind'] for op in ops) == sorted(passes)
    for op in ops:
        assert set(op['dtypes']) == {'f32'} and set(op['asked']) == {'bf16'}, op['kind']
        assert set(op['asked_by']) == {'promoted'}, op['kind']
        assert f"its {passes[op['kind']]} pass" in op['asked_why'][0], op['asked_why']
        assert {p['mechanism'] for p in op['stands_for']} == {'promoted'}  # half its bytes
        assert sum(p['bytes'] for p in op['stands_for']) * 2 == op['bytes']
    # the check can fail: the same program in f32 asks and carries f32, nothing promoted
    x32 = jax.ShapeDtypeStruct((64, 16), jnp.float32, sharding=NamedSharding(mesh, P('data')))
    ops = inspector.inspect(f, x32).json()['programs']['program']
    assert all(set(op['asked']) == {'f32'} and not any(op['asked_by']) for op in ops)


def op(kind, axes, phase, shape=(64, 64), dtype='f32', **fields) -> dict:
    return {'kind': kind, 'axes': axes, 'phase': phase, 'shapes': [shape], 'dtypes': [dtype],
            'stands_for': [], **fields}  # fmt: skip


def test_each_operand_is_classed_by_kind_axes_and_phase():
    plan = plans.parse('data:2,fsdp:2,model:2', None, 8, precision=BF16)
    cases = [
        (op('all-gather', ['fsdp'], 'forward'), 'weight'),
        (op('all-gather', ['model'], 'forward'), 'activation'),
        (op('all-reduce', ['model'], 'forward'), 'activation'),
        (op('all-reduce', ['model'], 'backward'), 'activation'),  # an input's gradient
        (op('all-reduce', ['data', 'fsdp'], 'backward'), 'gradient'),  # the partitioner's
        (op('reduce-scatter', ['fsdp'], 'backward'), 'gradient'),
        (op('all-reduce', ['data'], 'outside-grad'), 'gradient'),  # written after grad
        (op('all-reduce', ['data/fsdp~2'], 'backward'), 'gradient'),  # part of their groups
        (op('all-reduce', ['fsdp'], 'forward'), 'activation'),  # an embedding's partial rows
        (op('all-reduce', ['data'], 'outside-grad', shape=()), 'metric'),
        (op('collective-permute', ['fsdp', 'model'], 'backward'), 'activation'),
        (op('all-gather', ['fsdp'], 'forward', dtype='s32'), None),  # token ids: no float
    ]
    for o, want in cases:
        assert policy.traffic(o, o['kind'], o['shapes'][0], o['dtypes'][0], plan) == want, o
    # 1F1B runs its vjp outside grad: its sums over 'model' are an input's gradient, its sum
    # over 'stage' the gradients outside the blocks, its sends a stage's activations
    pipe = plans.parse('data:2,stage:2,model:2', None, 8, precision=BF16, schedule='1f1b')
    cases = [
        (op('all-reduce', ['model'], 'outside-grad'), 'activation'),
        (op('all-reduce', ['stage'], 'outside-grad'), 'gradient'),
        (op('all-reduce', ['data'], 'outside-grad'), 'gradient'),
        (op('collective-permute', ['stage'], 'outside-grad'), 'activation'),
        (op('all-reduce', ['stage'], 'forward'), 'activation'),  # GPipe's outputs
    ]
    for o, want in cases:
        assert policy.traffic(o, o['kind'], o['shapes'][0], o['dtypes'][0], pipe) == want, o
    # a TPU's all-gather done as an all-reduce is the gather it stands for: a weight
    padded = op('all-reduce', ['fsdp'], 'forward', stands_for=[{'kind': 'all-gather',
                                                               'operand': 0}])  # fmt: skip
    (kind,) = policy.written_kinds(padded)
    assert policy.traffic(padded, kind, (64,), 'bf16', plan) == 'weight'
    # what each wants under --dtype=bfloat16: the gradients float32 (--reduce_dtype's default)
    want = {t: policy.wanted(t, plan.precision) for t in ('weight', 'activation', 'gradient')}
    assert want == {'weight': 'bf16', 'activation': 'bf16', 'gradient': 'f32'}
    assert policy.wanted('metric', plan.precision) == 'f32'


def test_an_operand_is_off_the_policy_where_asked_otherwise_or_narrowed_by_the_compiler():
    off = policy.off_policy
    assert off('gradient', 'f32', 'f32', 'f32', '') == ''
    assert off('gradient', 'f32', 'bf16', 'f32', 'promoted') == 'dtype-asked'  # the step's
    assert off('weight', 'bf16', 'bf16', 'f32', 'promoted') == ''  # XLA:CPU's promotion
    assert off('weight', 'f32', 'f32', 'bf16', 'narrowed') == ''  # a DEFAULT-precision dot's
    assert off('gradient', 'f32', 'f32', 'bf16', 'compiler') == 'dtype-carried'  # jax#27496
    assert off('gradient', 'f32', None, 'bf16', '') == 'dtype-carried'  # nothing to match
    assert off('weight', 'bf16', None, 'f32', '') == ''  # unmatched, wider: may be promoted
    assert off(None, 'f32', 'bf16', 'bf16', '') == ''  # no float traffic


def abstract_state(model: str, batch_size: int, model_config=None):
    """(graphdef, loss, abstract TrainState, abstract batch) of `model`, as the inspector's."""
    make_model, loss_fn, batch = twins.model_and_batch(model, batch_size, model_config)
    tx = make_optimizer(cfg.TrainConfig())
    graphdef, state = nnx.eval_shape(lambda: create_state(make_model(nnx.Rngs(0)), tx))
    return graphdef, loss_fn, tx, state, batch


def audited(module, plan: plans.Plan) -> tuple[list[dict], list[dict]]:
    """(ops, dtype surprises) of `module`'s MLP train step compiled on 8 devices."""
    mesh = mesh_for(plan, explicit.AXIS_TYPE)
    graphdef, loss_fn, tx, state, batch = abstract_state('mlp', 64)
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state,
                         state_shardings(state, mesh, plan))  # fmt: skip
    step = module.train_step(graphdef, loss_fn, tx, mesh, plan)
    lowered = step.lower(state, twins.with_sharding(batch, mesh, rows(plan)))
    compiled, _, partitioned = compile_all([('step', lowered)])['step']
    ops = analyse(compiled, mesh, 'h100x8', partitioned=partitioned)['ops']
    return ops, policy.audit(ops, plan)


def test_a_planted_bf16_reduction_is_a_surprise_named_by_its_line():
    """tools/zoo/reduce_bf16.py: explicit/dp.py with the gradients all-reduced in bf16 under a
    float32 policy. The correct file first: no surprise."""
    plan = plans.parse('data:8', None, 8)
    ops, found = audited(explicit.dp, plan)
    assert found == [] and {d for o in ops for d in o['asked']} == {'f32'}
    ops, found = audited(reduce_bf16, plan)
    (surprise,) = found
    assert surprise['kind'] == 'dtype-asked' and surprise['file'] == 'tools/zoo/reduce_bf16.py'
    with open(reduce_bf16.__file__) as f:
        line = next(i for i, t in enumerate(f, start=1) if 'jax.lax.pmean(' in t)
    assert surprise['line'] == line, surprise
    wants = 'gradient operand(s) in bf16 where the policy wants f32 (--reduce_dtype=float32)'
    assert wants in surprise['what'], surprise
    assert 'dtype-asked' in next(o for o in ops if o['name'] == surprise['op'])['flags']


def test_the_expectation_gathers_fsdp_in_bf16_at_half_the_bytes():
    """Issue 41, item 6: fsdp's expected gathers follow --dtype, its reductions --reduce_dtype."""

    def records(precision):
        plan = plans.parse('fsdp:8', None, 8, precision=precision)
        mc = cfg.TransformerConfig(**SHAPE, dtype=precision.compute, reduce_dtype=precision.reduce)
        params = abstract_state('transformer', 16, mc)[3].params
        found = expectation(plan, 'transformer', params, mesh_for(plan), 16, mc)['collectives']
        return {(r['kind'], r['phase']): r['bytes'] for r in found}

    f32, bf16 = records(plans.Precision()), records(BF16)
    both = records(plans.Precision(compute='bfloat16', reduce='bfloat16'))
    gathers = [k for k in f32 if k[0] == 'all-gather']
    assert len(gathers) == 3  # outside the layers; each layer, forward and again backward
    assert all(bf16[k] * 2 == f32[k] for k in gathers)
    assert all(bf16[k] == f32[k] for k in f32 if k[0] != 'all-gather')  # gradients: f32
    assert all(both[k] * 2 == f32[k] for k in f32)  # and with --reduce_dtype=bfloat16 too


# {(mesh, --reduce_dtype): {twin: {traffic: 'asked>carried', '!' where off the policy}}}, the
# partitioned and compiled programs of the probe's transformer under --dtype=bfloat16 on the CPU;
# the metrics, every twin's, are f32>f32. Under --reduce_dtype=bfloat16 explicit/ alone: auto/ and
# typed/ refuse it (they asked bf16,f32 for the gradients, the partitioner's own f32 reductions
# of those formed in f32, until 2026-12-05)
TABLE = {
    ('data:8', 'float32'): {
        'auto': {'gradient': 'f32>f32'},
        'explicit': {'gradient': 'f32>f32'},
        'typed': {'gradient': 'f32>f32'},
    },
    ('data:8', 'bfloat16'): {
        'explicit': {'gradient': 'bf16>f32'},
    },
    ('fsdp:8', 'float32'): {
        'auto': {'gradient': 'f32>f32', 'weight': 'bf16>f32'},
        'explicit': {'gradient': 'f32>f32', 'weight': 'bf16>f32'},
        'typed': {'gradient': 'f32>f32', 'weight': 'bf16>f32'},
    },
    ('fsdp:8', 'bfloat16'): {
        'explicit': {'gradient': 'bf16>f32', 'weight': 'bf16>f32'},
    },
    ('data:4,model:2', 'float32'): {
        'auto': {'activation': 'bf16>f32', 'gradient': 'f32>f32'},
        'explicit': {'activation': 'bf16>f32', 'gradient': 'f32>f32'},
        'typed': {'activation': 'bf16>f32', 'gradient': 'f32>f32'},
    },
    ('data:4,model:2', 'bfloat16'): {
        'explicit': {'activation': 'bf16>f32', 'gradient': 'bf16>f32'},
    },
    ('data:2,fsdp:2,model:2', 'float32'): {
        'auto': {'activation': 'bf16,f32>f32!', 'gradient': 'f32>f32', 'weight': 'bf16>f32'},
        'explicit': {'activation': 'bf16>f32', 'gradient': 'f32>f32', 'weight': 'bf16>f32'},
        'typed': {'activation': 'bf16>f32', 'gradient': 'f32>f32', 'weight': 'bf16>f32'},
    },
    ('data:2,fsdp:2,model:2', 'bfloat16'): {
        'explicit': {'activation': 'bf16>f32', 'gradient': 'bf16>f32', 'weight': 'bf16>f32'},
    },
}  # fmt: skip


@SLOW
@pytest.mark.parametrize('reduce', ['float32', 'bfloat16'])
@pytest.mark.parametrize('mesh', ['data:8', 'fsdp:8', 'data:4,model:2', 'data:2,fsdp:2,model:2'])
def test_the_dtypes_each_twin_asks_for_and_the_cpu_carries(mesh, reduce):
    r = report(mesh, plans.Precision(compute='bfloat16', reduce=reduce))
    # auto/ and typed/ refuse reduce bf16 (their partitioner reduces where a gradient is
    # formed), each in its one line, and the inspector shows explicit/ alone
    assert sorted(r['refused']) == ([] if reduce == 'float32' else ['auto', 'typed'])
    assert all(f'--reduce_dtype={reduce} in the {t} twin' in r['refused'][t] for t in r['refused'])
    found = table(r)
    assert all(traffic.pop('metric') == 'f32>f32' for traffic in found.values())
    assert found == TABLE[(mesh, reduce)]
    assert dtype_surprises(r, 'explicit') == []  # the written twin asks what the policy says
    for twin, ops in r['programs'].items():
        for o in ops:  # XLA:CPU carries every float collective in f32, and says so
            for asked, carried, why in zip(o['asked'], o['dtypes'], o['asked_why']):
                assert carried in ('f32', 's32', 'u32', 'pred'), (twin, o['kind'])
                assert (asked != carried) == why.startswith('XLA:CPU carries'), (twin, why)
    # the expectation follows the policy: explicit's fsdp gathers move bf16 as asked
    for v in r['expected_vs_compiled']:
        if v['kind'] == 'all-gather':
            assert v['verdict'] in ('matches', 'explained') and v['as_written'] == v['expected']


@SLOW
def test_1f1b_sends_activations_in_bf16_and_sums_its_gradients_in_float32():
    """Issue 42, item 5: the pipeline's traffic under the policy. 1F1B on data:2,stage:2,model:2
    (--dtype=bfloat16): each stage's sends and the 'model' sums of its hand-run vjp carry
    --dtype, the gradients summed over 'data' and over 'stage' (outside the blocks) float32;
    every twin asks exactly that (no dtype surprise)."""
    mesh = 'data:2,stage:2,model:2'
    plan = plans.parse(mesh, None, 8, precision=BF16, schedule='1f1b', microbatches=4)
    model_config = cfg.TransformerConfig(**{**SHAPE, 'num_layers': 4}, dtype='bfloat16')
    config = dataclasses.replace(cfg.TRAIN_DEFAULTS['transformer'], batch_size=16)
    r = twins.inspect('transformer', config, mesh_for(plan, AxisType.Auto), plan, model_config)
    r = json.loads(json.dumps(r))
    assert r['refused'] == {}
    for twin in ('auto', 'explicit', 'typed'):
        found = r['dtypes'][twin]

        def asked(traffic, kind, axes):
            return {d for x in found if (x['traffic'], x['kind'], x['axes']) == (traffic, kind, axes)
                    for d in x['asked']}  # fmt: skip

        assert asked('activation', 'collective-permute', 'stage') == {'bf16'}, found
        assert asked('gradient', 'all-reduce', 'stage') == {'f32'}, found
        assert asked('activation', 'all-reduce', 'model') == {'bf16'}, found
        assert asked('gradient', 'all-reduce', 'model') == set(), found
        assert dtype_surprises(r, twin) == [], twin


needs_libtpu = pytest.mark.skipif(
    not libtpu_installed(),
    reason='libtpu is not installed: pip install -e ".[tpu]" (CI installs it)',
)


@SLOW
@needs_libtpu
def test_on_a_tpu_every_twin_reduces_in_float32_and_gathers_in_bf16():
    """The probe of docs/numerics.md compiled for tpu-v5e-8 (fsdp:8, --dtype=bfloat16, the
    gradients float32): what the TPU carries is what the policy says in every twin (items 4:
    auto's and typed's gradients were reduced in bf16 there), but one all-gather of auto's:
    its weights outside the layers are gathered in bf16 now (auto/fsdp.gather_outside; the
    forward's f32 gathers of the table, at the lookup and the tied head, are gone), and the
    TPU's partitioner still all-gathers the whole table, f32[256, 64], once in the backward at
    the lookup (its float32 gradient made whole; XLA:CPU's program has no such gather).
    explicit's gathers carry the expectation's bytes, bf16's: half float32's (item 6)."""
    r = report('fsdp:8', BF16, target='tpu-v5e-8')
    found = table(r)
    assert all(traffic.pop('metric') == 'f32>f32' for traffic in found.values())
    assert found == {
        'auto': {'gradient': 'f32>f32', 'weight': 'bf16,f32>bf16,f32!'},
        'explicit': {'gradient': 'f32>f32', 'weight': 'bf16>bf16'},
        'typed': {'gradient': 'f32>f32', 'weight': 'bf16>bf16'},
    }
    assert dtype_surprises(r, 'explicit') == dtype_surprises(r, 'typed') == []
    assert [(s['kind'], s['file'], s['what'].split(' asks ')[0])
            for s in dtype_surprises(r, 'auto')] == [  # the lookup's, in the backward, alone
        ('dtype-asked', 'shard_parity/model/ops.py', 'all-gather over fsdp (backward)')
    ]  # fmt: skip
    gathers = [v for v in r['expected_vs_compiled'] if v['kind'] == 'all-gather']
    assert len(gathers) == 3 and all(v['as_written'] == v['expected'] for v in gathers), gathers


def loop_carries(jaxpr) -> list:
    """The avals every scan and while loop of `jaxpr` (and of the jaxprs inside it: jit,
    shard_map, cond, the loops' bodies) carries from one trip to the next."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == 'scan':  # its outputs: the final carry, then the ys
            out += [v.aval for v in eqn.outvars[: eqn.params['num_carry']]]
        elif eqn.primitive.name == 'while':
            out += [
                v.aval
                for v in eqn.invars[eqn.params['cond_nconsts'] + eqn.params['body_nconsts'] :]
            ]
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                inner = sub if hasattr(sub, 'eqns') else getattr(sub, 'jaxpr', None)  # or closed
                if hasattr(inner, 'eqns'):
                    out += loop_carries(inner)
    return out


@pytest.mark.skipif(
    jax.__version_info__ >= (0, 11),
    reason="jax 0.11+ writes a scan's carries as trees (ft_in, ft_out) and hoists the ones a loop "
    'leaves unchanged into its constants: the carries are read on jax 0.10 (CI leg 1)',
)
@pytest.mark.parametrize('twin', ['auto', 'explicit', 'typed'])
@pytest.mark.parametrize('schedule', ['gpipe', '1f1b', 'interleaved'])
def test_microbatch_gradients_accumulate_in_float32_under_every_schedule(schedule, twin):
    """Issue 42, item 5 (and 41's policy): under --dtype=bfloat16 each pipeline's loops carry
    its activations in bf16 (f32[..., T, C] would be a cast too few) and every gradient it
    accumulates over the microbatches in float32: GPipe's (the transposed scan's cotangents
    of the stage's weights), 1F1B's and interleaved's (their `Stage.grads` and the rest's).
    Traced, not compiled: the loops' carries as the twin writes them, on data:2,stage:2,model:2
    with M = 2 (a microbatch's activation [8, T, C], a device's [4, T, C]; the position
    table's gradient, [T, C] or one a slot [2, T, C], is a weight's)."""
    plan = plans.parse('data:2,stage:2,model:2', None, 8, precision=BF16, schedule=schedule,
                       microbatches=2, virtual=2 if schedule == 'interleaved' else None)  # fmt: skip
    model_config = cfg.TransformerConfig(**{**SHAPE, 'num_layers': 4}, dtype='bfloat16')
    package = {'auto': auto, 'explicit': explicit, 'typed': typed}[twin]
    module, mesh = strategy_file(package, plan), mesh_for(plan, package.AXIS_TYPE)
    graphdef, loss_fn, tx, state, batch = abstract_state('transformer', 16, model_config)
    fn = module.loss_and_grads(graphdef, loss_fn, mesh, plan)
    params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          state.params, state_shardings(state.params, mesh, plan))  # fmt: skip
    batch = twins.with_sharding(batch, mesh, rows(plan))
    carries = loop_carries(jax.make_jaxpr(fn)(params, batch).jaxpr)
    rows_t_c = {(b, SHAPE['seq_len'], SHAPE['embed_dim']) for b in (4, 8)}
    activation = lambda a: a.shape[-3:] in rows_t_c  # noqa: E731
    assert {a.dtype for a in carries if activation(a)} == {jnp.dtype(jnp.bfloat16)}
    weights = [a for a in carries if not activation(a) and a.ndim >= 2]
    assert {a.dtype for a in weights} == {jnp.dtype(jnp.float32)}
    up = {(64, 256), (64, 128)}  # the MLP's up-projection's, [C, 4C], split over 'model' or not
    assert any(a.shape[-2:] in up for a in weights)
