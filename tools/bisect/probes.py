"""Each gradient leaf's rounding noise, measured on the state it judges (tools/bisect/
budgets.py turns it into the leaf's budget): side A's step run again, rounded otherwise.

Two correct twins differ because they round at other places, in other orders. Where either
side splits more than the batch's rows (tensor, sequence, pipeline, expert parallelism), a
probe runs side A's loss and gradients on one device with every rounding site jittered: each
module's output (marked while tracing, `marked`), each contraction's and reduction's result
and each narrowing cast (`SITES`; the step's jaxpr evaluated op by op, `_evaluate`) is
multiplied by (1 + u r) on the way forward and its cotangent by (1 + u r') on the way back, an
identity with a custom VJP (`jitter`); u the unit round-off of that array's dtype, r and r'
standard normal, a fresh draw per element and per probe. Where the sides split only the rows,
each row's arithmetic is the same on both, and a probe is the rows in a random order cut into
the sides' blocks (`_split`). The spread of the probes' gradients about the clean one,

    noise(leaf) = sqrt(mean over probes of ||g_probe - g||^2) / ||g||,

is that leaf's rounding at this state: where per-example gradients cancel (a trained model's
mean gradient is small against its terms), the same rounding of the terms is a larger share of
the mean, and the probes see it, where a flat fraction of the norm did not (issue 52). Each
loss metric gets the same spread. Only side A's program and values enter: B's are judged.

Cost per step compared: one clean and PROBES (4) probe passes (forward and backward) of the
model on one device; the jittered program compiles once per process (docs/numerics.md,
"Measured budgets", gives the seconds)."""

import functools
import itertools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from shard_parity import numerics
from shard_parity.step import bind

from .intercept import intercepted
from .leaves import global_norm

PROBES = 4  # random probes per step (the minimum)


def _u(dtype) -> float:
    name = jnp.dtype(dtype).name
    return numerics.UNIT_ROUNDOFF.get(name, numerics.UNIT_ROUNDOFF['float32'])


@jax.custom_vjp
def jitter(x, forward, backward):
    """x x (1 + u forward) in x's dtype; on the way back the cotangent x (1 + u backward)."""
    return (x.astype(jnp.float32) * (1 + _u(x.dtype) * forward)).astype(x.dtype)


def _jitter_fwd(x, forward, backward):
    return jitter(x, forward, backward), backward


def _jitter_bwd(backward, g):
    out = (g.astype(jnp.float32) * (1 + _u(g.dtype) * backward)).astype(g.dtype)
    return out, jnp.zeros_like(backward), jnp.zeros_like(backward)


jitter.defvjp(_jitter_fwd, _jitter_bwd)


# where two correct programs round differently (SITES): each module's output and its cotangent
# (marked while tracing: `marked`), each contraction's and reduction's result (a split over
# devices or another tiling sums in another order and rounds partial sums), and each narrowing
# cast. An elementwise op (add, exp, multiply) computes the same rounding of the same inputs on
# either side, row by row, and is not jittered: jittered too, the MLP's first-layer bias read
# 12 times its measured error under dp.
SITES = {'dot_general', 'reduce_sum', 'cumsum', 'conv_general_dilated', 'reduce_precision'}
CALLS = ('jaxpr', 'call_jaxpr', 'fun_jaxpr')  # where a call's own program is (jit, custom_jvp)


def _rounds(eqn, x) -> bool:
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return False
    if eqn.primitive.name == 'convert_element_type':  # a narrowing cast rounds
        source = eqn.invars[0].aval.dtype
        return jnp.issubdtype(source, jnp.floating) and _u(x.dtype) > _u(source)
    return eqn.primitive.name in SITES


def _jittered(eqn, ins, x, draw):
    """x's jitter; a narrowing cast's forward draw by the share its own rounding took from
    this value (a float32 parameter that bf16 holds exactly is cast exactly: no jitter)."""
    forward, backward = draw(x.shape)
    if eqn.primitive.name == 'convert_element_type':
        source = ins[0].astype(jnp.float32)
        taken = jnp.abs(source - x.astype(jnp.float32)) / (jnp.abs(source) * _u(x.dtype) + 1e-30)
        forward = forward * jax.lax.stop_gradient(taken)
    return jitter(x, forward, backward)


def _evaluate(jaxpr, consts, args, draw):
    """jaxpr's outputs from args, every rounded result jittered (`draw(shape)` gives r and r'):
    a call (jit, a custom derivative's function) is evaluated inside, op by op; a loop (scan,
    while) is bound as it is, unjittered inside."""
    from jax.extend import core

    env = {}

    def read(v):
        return v.val if isinstance(v, core.Literal) else env[v]

    for v, x in zip(jaxpr.constvars, consts):
        env[v] = x
    for v, x in zip(jaxpr.invars, args):
        env[v] = x
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        inner = next((eqn.params[k] for k in CALLS if k in eqn.params), None)
        if isinstance(inner, core.ClosedJaxpr):
            outs = _evaluate(inner.jaxpr, inner.consts, ins, draw)
        elif isinstance(inner, core.Jaxpr):
            outs = _evaluate(inner, (), ins, draw)
        else:
            outs = eqn.primitive.bind(*ins, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
            outs = [_jittered(eqn, ins, x, draw) if _rounds(eqn, x) else x for x in outs]
        for v, x in zip(eqn.outvars, outs):
            if not isinstance(v, core.DropVar):
                env[v] = x
    return [read(v) for v in jaxpr.outvars]


def marked(loss_fn):
    """`loss_fn` with each module's per-example output marked as a jitter site: a
    reduce_precision to its own format (an exact identity), which `_evaluate` jitters."""

    def mark(path, module, x, first):
        info = jnp.finfo(x.dtype)
        return jax.lax.reduce_precision(x, exponent_bits=info.nexp, mantissa_bits=info.nmant)

    def fn(model, batch):
        with intercepted(model, next(iter(batch.values())).shape[0], mark):
            return loss_fn(model, batch)

    return fn


def noisy(graphdef, loss_fn):
    """fn(params, batch, key, on) -> (metrics, grads): side A's loss and gradients on one
    device, every rounded result and its cotangent jittered by the draws of `key` (`on` 0.0:
    the clean step, the same program)."""
    plain = bind(graphdef, marked(loss_fn))

    def loss(params, batch, key, on):
        closed = jax.make_jaxpr(plain)(params, batch)
        flat = jax.tree.leaves((params, batch))
        evaluate = lambda draw, *args: _evaluate(closed.jaxpr, closed.consts, args, draw)
        sizes = []  # each site's elements, in the order `_evaluate` draws them

        def count(shape):
            sizes.append(math.prod(shape))
            return jnp.zeros((2, *shape), jnp.float32)

        jax.eval_shape(functools.partial(evaluate, count), *flat)
        # one draw for every site, sliced: a draw per site compiled to a threefry each (374 in
        # the corpus's 6-layer mixture of experts: 55 s of XLA:CPU's compile against 6 s)
        pool = jax.random.normal(key, (2, sum(sizes)), jnp.float32) * on
        starts = iter(itertools.accumulate(sizes, initial=0))

        def draw(shape):
            start = next(starts)
            part = jax.lax.slice_in_dim(pool, start, start + math.prod(shape), axis=1)
            return part.reshape(2, *shape)

        outs = evaluate(draw, *flat)
        return jax.tree.unflatten(jax.tree.structure(jax.eval_shape(plain, params, batch)), outs)

    grad = jax.value_and_grad(loss, has_aux=True)

    @jax.jit
    def step(params, batch, key, on):
        (_, metrics), grads = grad(params, batch, key, on)
        return metrics, grads

    return step


@functools.lru_cache(maxsize=8)
def _compiled(graphdef, loss_fn):
    return noisy(graphdef, loss_fn)


@functools.lru_cache(maxsize=8)
def _split(graphdef, loss_fn, blocks: int):
    """fn(params, batch) -> (metrics, grads): the batch's rows in `blocks` equal blocks, each
    block's loss and gradients as side A's program computes them, averaged in float32: what a
    side that splits the rows over devices computes (the same rows, summed in another order)."""
    grad = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    @jax.jit
    def step(params, batch):
        cut = jax.tree.map(lambda x: x.reshape(blocks, x.shape[0] // blocks, *x.shape[1:]), batch)
        (_, metrics), grads = jax.lax.map(lambda b: grad(params, b), cut)
        mean = lambda x: jnp.mean(x.astype(jnp.float32), 0)
        return jax.tree.map(mean, metrics), jax.tree.map(mean, grads)

    return step


class Measured(NamedTuple):
    """What the probes measure at one state (`measure`), each relative to its clean value."""

    spread: dict  # {loss metric: noise}
    noise: list  # noise per gradient leaf, in tree order
    elements: list  # each leaf's elements' RMS spread, an array of its shape (numerics.spread's)
    norm: float  # the gradients' global norm's noise: what AdamW's clip divides by


def measure(graphdef, loss_fn, params, batch, probes: int = PROBES, seed: int = 0, rows=0):
    """Measured(spread, noise, elements, norm): each quantity's spread under `probes` runs of
    side A's step, relative to its clean value (0 where the clean value is 0 and no probe moved
    it; inf where it is 0 and a probe did). `rows` 0: every site
    jittered (a side that splits more than the rows: 'model', 'seq', 'stage', 'expert', where
    each row's own arithmetic differs); `rows` n > 0, where the sides split only the batch's rows
    (into at most n blocks): each row's arithmetic is the same on both, only the sums over rows
    differ, so a probe is the rows in a random order cut into n blocks (`_split`), no jitter."""
    step = _compiled(graphdef, loss_fn)
    params = jax.tree.map(np.asarray, params)
    if rows:  # the clean step as A's own program computes it: one block of every row
        clean_m, clean_g = jax.device_get(_split(graphdef, loss_fn, 1)(params, batch))
    else:  # the jittered program itself, its draws off
        clean_m, clean_g = jax.device_get(step(params, batch, jax.random.key(seed), 0.0))
    flat = [np.asarray(g, np.float64) for g in jax.tree.leaves(clean_g)]
    sq_g, sq_m, sq_n = [0.0] * len(flat), dict.fromkeys(clean_m, 0.0), 0.0
    norm = global_norm(flat)
    order = np.random.default_rng(seed)
    for p in range(probes):
        if rows:
            shuffled = order.permutation(len(next(iter(batch.values()))))
            cut = {k: np.asarray(v)[shuffled] for k, v in batch.items()}
            m, g = jax.device_get(_split(graphdef, loss_fn, rows)(params, cut))
        else:
            key = jax.random.key(seed * 1000 + p + 1)
            m, g = jax.device_get(step(params, batch, key, 1.0))
        leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(g)]
        for i, (x, c) in enumerate(zip(leaves, flat, strict=True)):
            sq_g[i] = sq_g[i] + (x - c) ** 2 / probes  # per element
        sq_n += (global_norm(leaves) - norm) ** 2 / probes
        for k in sq_m:
            sq_m[k] += (float(np.asarray(m[k], np.float64)) - float(clean_m[k])) ** 2 / probes
    grads = [_relative(float(np.sum(s)), float(np.linalg.norm(c))) for s, c in zip(sq_g, flat)]
    metrics = {k: _relative(s, abs(float(clean_m[k]))) for k, s in sq_m.items()}
    return Measured(metrics, grads, [np.sqrt(s) for s in sq_g], _relative(sq_n, norm))


def _relative(square: float, size: float) -> float:
    if size:
        return float(np.sqrt(square)) / size
    return float('inf') if square else 0.0


def measured_or_noted(report, what: str, *args, **kwargs):
    """`measure(*args, **kwargs)`, or None where the op-by-op probe cannot evaluate the program
    (its caller then takes the error model's flat budgets): `report` gains one note saying so,
    `what` naming what the probes could not run."""
    try:
        return measure(*args, **kwargs)
    except Exception as e:  # a program the op-by-op probe cannot evaluate: the flat model
        note = (f'{what} ({type(e).__name__}: {str(e).splitlines()[0][:120]}); the error '
                "model's flat budgets instead")  # fmt: skip
        if note not in report.notes:
            report.notes.append(note)
        return None
