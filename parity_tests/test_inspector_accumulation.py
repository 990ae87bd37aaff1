"""Claim: the inspector's expectation counts --gradient_accumulation_steps=K (docs/accumulation.md).
What runs in the forward and backward runs once per microbatch, on 1/K of the rows: FSDP's
per-layer gathers and reduce-scatters (ZeRO-3's nature, in every twin), tensor parallelism's
activation sums; the gradients' reductions after grad run once a step. Held against the
compiled explicit/ step, per kind, mesh axes and phase, the records at K match it, where the
records at K = 1 do not (the comparison can fail). A gradient reduced once per microbatch
inside the accumulation loop (the bug zoo's accum_reduced_in_loop) is still the surprise
`reduction-per-iteration`; FSDP's expected per-microbatch collectives raise none. Compile only."""

import dataclasses
import json

import jax
import pytest
from flax import nnx
from jax.sharding import AbstractMesh, AxisType

from parity_tests.helpers import TINY_TRANSFORMER as SMALL
from shard_parity import config as cfg
from shard_parity import explicit
from shard_parity import plan as plans
from shard_parity.devices import libtpu_installed
from shard_parity.inspector import target as targets
from shard_parity.inspector import twins
from shard_parity.inspector.expect import expectation
from shard_parity.inspector.reconcile import DIFFERS, MATCHES, rows
from shard_parity.mesh import mesh_for
from shard_parity.model.mlp import MLP
from shard_parity.model.transformer import Transformer
from shard_parity.tools.zoo import accum_reduced_in_loop

SLOW = pytest.mark.slow
needs_libtpu = pytest.mark.skipif(not libtpu_installed(), reason='libtpu is not installed')
BATCH = 32  # four rows a device on 8: K up to 4 (SMALL: two layers, 16 positions, width 32)


def records(text, k, model='transformer'):
    plan = plans.parse(text, 'composed', 8)
    mesh = AbstractMesh(plan.shape, plan.names, axis_types=(AxisType.Auto,) * len(plan.names))
    make = (lambda: MLP(cfg.MLPConfig(), rngs=nnx.Rngs(0))) if model == 'mlp' else (
        lambda: Transformer(SMALL, rngs=nnx.Rngs(0)))  # fmt: skip
    params = nnx.state(nnx.eval_shape(make), nnx.Param)
    return expectation(plan, model, params, mesh, BATCH, SMALL, k)['collectives']


def test_the_per_layer_records_count_each_microbatch():
    """data:2,fsdp:2,model:2 at K = 4 against K = 1: each forward and backward record runs
    4 times as often, fsdp's on the same weights, model's on a quarter of the rows; the
    reductions outside grad are the same records."""
    one, four = records('data:2,fsdp:2,model:2', 1), records('data:2,fsdp:2,model:2', 4)
    assert len(one) == len(four)
    for a, b in zip(one, four):
        if a['phase'] == 'outside-grad':
            assert a == b
            continue
        assert b['trips'] == 4 * a['trips'], (a, b)
        assert b['bytes'] == (a['bytes'] // 4 if a['piece'] == 'model' else a['bytes']), (a, b)
        assert b['what'].endswith('once per microbatch (K = 4)'), b
    mlp = records('data:4,model:2', 4, 'mlp')
    (tp,) = [r for r in mlp if r['piece'] == 'model']
    assert (tp['trips'], tp['bytes']) == (4, 8 // 4 * 512 * 4)  # 8 rows a device, 2 a pass


def explicit_step(text, strategy, k, target=None, config=SMALL, batch=BATCH):
    """(the expectation's records at K = 1 and at `k`, the expectation's figures at `k`,
    explicit/'s analysed step at `k`), the transformer of shape `config`."""
    devices = targets.devices(target) if target else jax.devices()
    plan = plans.parse(text, strategy, len(devices))
    mesh = mesh_for(plan, AxisType.Auto, devices=devices)
    train = dataclasses.replace(cfg.TRAIN_DEFAULTS['transformer'], batch_size=batch,
                                gradient_accumulation_steps=k)  # fmt: skip
    params, steps = twins.lowered_steps('transformer', train, mesh, plan, config)
    chosen = targets.get(target) if target else None
    read = twins.read_steps(((n, s) for n, s in steps if n == 'explicit'), [], plan,
                            'h100x8', False, chosen)  # fmt: skip
    at = lambda k: expectation(plan, 'transformer', params, mesh, batch, config, k)  # noqa: E731
    return at(1)['collectives'], at(k), read['explicit']


@pytest.mark.parametrize('k', [pytest.param(2, marks=SLOW), 4])
def test_fsdp_at_k_has_no_unexplained_row(k):
    """fsdp:8 at K: the layers' gathers (forward, and again for the recompute) and their
    gradients' reduce-scatters run once per microbatch, and the records say so: every row
    matches explicit's program to the byte; the records at K = 1 leave those rows unexplained.
    None of them is a `reduction-per-iteration`: explicit/ reduces once, after the loop."""
    at_one, at_k, program = explicit_step('fsdp:8', 'fsdp', k)
    verdicts = rows(at_k['collectives'], program['ops'])
    assert {v['verdict'] for v in verdicts} == {MATCHES}, verdicts
    unexplained = {(v['kind'], v['phase']) for v in rows(at_one, program['ops'])
                   if v['verdict'] == DIFFERS}  # fmt: skip
    assert unexplained == {('all-gather', 'forward'), ('all-gather', 'backward'),
                           ('reduce-scatter', 'backward')}  # fmt: skip
    assert max(op['trip_count'] for op in program['ops']) == 2 * (k - 1)  # 2 layers, the loop
    assert program['surprises'] == []


@SLOW
def test_composed_at_k_has_no_unexplained_row():
    """data:2,fsdp:2,model:2 at K = 2: fsdp's per-layer rows and model's activation sums (a
    microbatch's rows) per microbatch, the gradient's reductions once: every row matches."""
    _, at_k, program = explicit_step('data:2,fsdp:2,model:2', 'composed', 2)
    assert {v['verdict'] for v in rows(at_k['collectives'], program['ops'])} == {MATCHES}


@SLOW
def test_the_ring_at_k_runs_once_per_microbatch():
    """data:2,seq:4 (one layer, 32 positions) at K = 4, a microbatch of the rows at K = 1's
    size: the ring's permutes run 4 times as often, each the same block; the program holds
    the first microbatch's ring and the loop's (16 permutes, as the figures say), and every
    row matches."""
    one = cfg.TransformerConfig(seq_len=32, num_layers=1, num_heads=4, num_kv_heads=2,
                                embed_dim=32)  # fmt: skip
    _, at_k, program = explicit_step('data:2,seq:4', 'cp', 4, config=one, batch=32)
    ring = at_k['ring']
    permutes = [op for op in program['ops'] if op['kind'] == 'collective-permute']
    assert ring['shape'] == (4, 8, 2, 8) and ring['bytes'] == 4 * 20 * 2_048
    assert len(permutes) == ring['count'] == 16
    assert {v['verdict'] for v in rows(at_k['collectives'], program['ops'])} == {MATCHES}


@SLOW
@needs_libtpu
def test_fsdp_at_k_on_a_tpu_has_no_unexplained_bytes():
    """Compiled for tpu-v5e-8 (--target, from shapes), fsdp:8 at K = 2, the default
    transformer's shape: every row explicit/ moves matches or is explained by a mechanism
    found in its program (the TPU's narrowed gathers), none a surprise; at K = 1's records
    the per-layer rows are unexplained."""
    at_one, at_k, program = explicit_step('fsdp:8', 'fsdp', 2, 'tpu-v5e-8',
                                          cfg.TransformerConfig(), 16)  # fmt: skip
    assert DIFFERS not in {v['verdict'] for v in rows(at_k['collectives'], program['ops'])}
    assert DIFFERS in {v['verdict'] for v in rows(at_one, program['ops'])}


def test_a_gradient_reduced_per_microbatch_is_still_a_surprise(monkeypatch):
    """The bug zoo's accum_reduced_in_loop (explicit/dp.py with a pmean per microbatch) in the
    twins' report, MLP on data:8 at K = 4: its all-reduce inside the loop is explicit's
    `reduction-per-iteration` surprise; explicit/dp.py's, once after the loop, is none."""

    chosen = twins.strategy_file

    def report(module=None):
        plan = plans.parse('data:8', 'dp', jax.device_count())
        mesh = mesh_for(plan, AxisType.Auto, devices=jax.devices())
        monkeypatch.setattr(twins, 'strategy_file', lambda twin, plan: (
            module if module and twin is explicit else chosen(twin, plan)))  # fmt: skip
        train = dataclasses.replace(cfg.TRAIN_DEFAULTS['mlp'], batch_size=64,
                                    gradient_accumulation_steps=4)  # fmt: skip
        r = json.loads(json.dumps(twins.inspect('mlp', train, mesh, plan, SMALL)))
        return [s['kind'] for s in r['surprises']['explicit']], r['expected_vs_compiled']

    kinds, verdicts = report(accum_reduced_in_loop)
    assert 'reduction-per-iteration' in kinds
    assert DIFFERS in {v['verdict'] for v in verdicts}  # the gradient's bytes x K
    kinds, verdicts = report()
    assert kinds == [] and {v['verdict'] for v in verdicts} == {MATCHES}
