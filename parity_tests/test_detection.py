"""Claim: the bisector sees bugs of small semantic effect, and says what it cannot see. Each of
the zoo's small-effect entries (an activation's approximation, a scale off by 2%, weight decay
on the wrong leaves, one microbatch of 16 dropped from the backward, every update 1% too
large) is caught in float32 at step 0 and from a short trained run's state; in bf16 it is
either caught or within the error model's detection limit at the leaf it moves, and that limit
is above its effect measured in float32. A correct bf16 pair from the trained state agrees.
python -m tools.margins prints each (a bug within bf16's limit: its effect as a fraction of the
limit). The rates over many steps are benchmarks/detection.py's (docs/detection.md)."""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from benchmarks import judging as D
from parity_tests import helpers
from parity_tests.helpers import record_model

# entry: (reference, case, the phase float32 catches it in)
SMALL = {
    'gelu_tanh': ('explicit', D.Case(), 'forward'),
    'grads_scaled': ('explicit', D.Case(), 'gradients'),
    'decay_all': ('explicit', D.Case(), 'update'),
    'microbatch_dropped': ('explicit', D.PP16, 'gradients'),
    'update_1pct': ('explicit', D.Case(), 'update'),
}


def test_decay_all_decays_the_vectors_by_the_rate_its_matrices_get():
    """tools.zoo.decay_all measures rate x decay from the optimizer itself: a vector's update
    gains -rate x decay x p, the matrix's is AdamW's own (a check that can fail: a vector's
    update without decay)."""
    from tools.zoo.decay_all import decayed_everywhere

    tx = optax.adamw(1e-2, weight_decay=0.5, mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p))
    params = {'w': jnp.full((4, 3), 2.0), 'b': jnp.full((3,), 3.0)}
    grads = {'w': jnp.ones((4, 3)), 'b': jnp.ones(3)}
    right, _ = tx.update(grads, tx.init(params), params)
    wrong, _ = decayed_everywhere(tx).update(grads, tx.init(params), params)
    np.testing.assert_allclose(wrong['w'], right['w'], rtol=1e-6)
    np.testing.assert_allclose(wrong['b'] - right['b'], -1e-2 * 0.5 * 3.0, rtol=1e-5)
    assert not np.allclose(wrong['b'], right['b'])


def test_update_1pct_and_grads_scaled_scale_by_what_they_say():
    from tools.zoo import grads_scaled, update_1pct

    tx = optax.sgd(0.1)
    params, grads = {'w': jnp.arange(3.0)}, {'w': jnp.ones(3)}
    right, _ = tx.update(grads, tx.init(params), params)
    wrong, _ = update_1pct.larger(tx, update_1pct.FACTOR).update(grads, tx.init(params), params)
    np.testing.assert_allclose(wrong['w'], 1.01 * right['w'], rtol=1e-7)
    np.testing.assert_allclose(grads_scaled.scaled(grads, grads_scaled.SCALE)['w'], 0.98)


def test_gelu_tanh_is_the_approximation_and_only_while_the_entry_traces():
    """The tanh approximation is at most ~5e-4 from the exact GELU and not 0; the model's name
    is bound to it only inside the entry's trace (the other side keeps the exact one)."""
    from shard_parity.model import ops, transformer
    from tools.zoo import gelu_tanh

    x = jnp.linspace(-6, 6, 2001)
    gap = float(jnp.max(jnp.abs(jax.nn.gelu(x, approximate=True) - ops.gelu(x))))
    assert 1e-5 < gap < 1e-3, gap
    seen = []
    traced = gelu_tanh.approximated(lambda p, b: seen.append(transformer.gelu) or p)
    jax.make_jaxpr(traced)(1.0, None)
    assert seen[0] is not ops.gelu and transformer.gelu is ops.gelu


def record_limit(effect: float, limit: float):
    """For python -m tools.margins: a bug within bf16's budget, its effect / the limit."""
    test = os.environ.get('PYTEST_CURRENT_TEST', '?').split(' ')[0]
    helpers.MODEL_MARGINS.append((test, 'limit', effect / limit))


@pytest.mark.slow  # 1.5 to 2 min each on 2 busy cores: four sides compiled, a 100-step run
@pytest.mark.parametrize('entry', SMALL)
def test_a_small_effect_is_caught_in_float32_and_in_bf16_caught_or_under_the_limit(entry):
    reference, case, phase = SMALL[entry]
    found = D.verdict(f'tools.zoo.{entry}', reference, case)
    for state, row in D.summary(found).items():
        print(f'{entry} {state}: {row}')
        # float32: the bisector's default tolerance names the phase, and the error model's
        # float32 budgets see the same (the effect: the first leaf's norm-wise error)
        assert row['f32'] == phase and row['phase'] == phase, row
        assert row['effect'] > 0 and math.isfinite(row['effect']), row
        model = found[state]['model']
        if model.phase is not None:  # caught in bf16, in any phase (a forward bug within the
            # forward's bf16 budget may show in gradients held to float32-sized budgets)
            assert model.budgets is None or model.budgets > 1, row
            record_model(model.report)
        else:  # within bf16's budgets: the limit at that leaf is above the effect
            assert row['limit'] is not None and row['limit'] > row['effect'], row
            record_limit(row['effect'], row['limit'])


@pytest.mark.slow  # ~1 min: two sides compiled, a 100-step run of one device
def test_a_correct_bf16_pair_from_a_trained_state_agrees():
    """one device against explicit/dp.py on data:8 in bf16, from the state after 100 steps and
    from the seed's: within every budget, and not equal (round-off there to be judged)."""
    pair = D.Pair('one_device', 'explicit', D.Case())
    batches = D.inputs(D.Case())[4]
    for start in (0, D.TRAINED):
        state = D.trained(D.Case(), 0, start) if start else jax.tree.map(
            np.asarray, D.inputs(D.Case())[3])  # fmt: skip
        step = pair.judge(state, batches.batch(start), start)
        print(f'from step {start}: {step.report.worst}')
        assert step.phase is None, step
        assert 0 < step.worst <= 1, step.worst
        record_model(step.report)
