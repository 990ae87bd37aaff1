"""The budgets of the gradients and of the update, leaf by leaf, at the state they judge
(tools/bisect/stepping.py), and what each comparison could not see (its detection limits).

Gradients: each leaf's rounding noise measured on side A's step (tools/bisect/probes.py),
C_PROBE times it, above float32's own reordering floor and the collective's rounding
(numerics.Budget). A leaf with little noise gets a tight budget; a trained model's leaf whose
mean gradient cancels its terms gets the wide one its rounding makes. Where a row's arithmetic
may differ between the sides (stepping.beyond_rows), plus C_CAST x `moved`: what A's own
gradient moves at the parameters rounded to the compute dtype, as one program keeps a cast
parameter in float32 and the other rounds it (one device against explicit on
data:2,fsdp:2,model:2 at 1e-3, steps 1-29: each leaf's error between the sides over that move
0.80-1.77, median 1.03; 3 x it keeps the pair within a third). Not where only the rows are
cut: there both sides' casts are the same (one device against explicit/dp.py on data:2, 300
trained steps: the sides about 1e-7 apart, the move 0.35-1.7%: docs/numerics.md). There,
instead, C_FLIP x the flips of a row's own roundings (`flips`): the two compiled programs
compute some values an ulp of float32 apart (explicit/dp.py's softmax backward divides by a
row's sum where one device's multiplies by its reciprocal), and on about a fifth of the steps
one of them rounds to bf16 a spacing apart (the query kernel 6.6e-5 apart at seed 1, step 0).

The update is judged as the update: each leaf's step (new minus old) against the other's,
norm-wise, relative to the step's own size, so that a warm-up step that moves a parameter by
1e-5 of itself is seen at 1% of that step, not of the parameter. The floor: two steps that
differ by eps relative round to float32 values that differ by an ulp with probability
eps |step| / ulp, so the norm-wise error of the stored steps is about eps + sqrt(eps q),
q = ||ulp(new)|| / ||step||; eps = STEP_EPS (float32's own discrepancy of two programs'
steps) plus, under the error model, the spread that the gradients' rounding makes of the
step (numerics.spread: sign flips at AdamW's first steps and all).

The loss, where the probes jitter every rounding site (`loss`): C_LOSS_NOISE x its own noise
under the probes plus C_LOSS_CAST x `cast`, what the loss moves where one side keeps a cast
parameter in float32 and the other rounds it, above float32's floor and the flips' terms
(numerics.Budget.loss at no carried rounding). Over 200 steps of one device against explicit on
data:2,fsdp:2,model:2 (bf16, 1e-3, no warm-up), the loss's error over that noise reaches 15
from initialisation, where the cast moves it most, and 2.5 after 1,000 steps; over the cast
1.9 and 2.5 (docs/numerics.md, "The loss's budget, measured"). Where only the rows are cut, or
the probes could not run: the error model's budget plus C_LOSS x `cast`.

A detection limit is the budget itself: a change of relative size d planted in a leaf moves
its norm-wise error by d, and correct pairs sit within a third of the budget, so a change of
twice the limit is caught and one of half of it reads "agree"."""

import math

import numpy as np

from shard_parity import numerics

from .leaves import Leaf, compare, global_norm, named_leaves

C_EST = 0.75  # the error two correct sides reach, per unit of the probes' noise (measured)
C_PROBE = 11.5  # a gradient leaf's budget: x that estimate (3 x the largest measured / estimate)
STEP_EPS = 1e-5  # float32: two programs' steps of one state and gradient, relative
C_STEP = 3.0  # the update's floor: x (eps + sqrt(eps q)) (the module docstring)
C_CAST = 3.0  # a gradient leaf's budget: + x what rounding the parameters moves it (`rounded`)
C_FLIP = 21.0  # where only the rows are cut: x a flip's expected noise (`flips`; 3 x 7, measured)
C_TURN = 7.0  # which elements a flip may turn at a sign-like step: x its RMS (the largest ratio)
# a parameter's step: x what the probes' spread moves it (numerics.C_MOVE is 10, from 2 steps;
# over 200 steps from initialisation at 1e-3, no warm-up, the largest error over it is 4.2)
C_MOVED = 13.0
# the loss where every site is jittered: x its noise under the probes (4 x C_EST), + x `cast`
C_LOSS_NOISE, C_LOSS_CAST = 3.0, 5.0


def gradients(
    model: numerics.Budget,
    noise: list[float],
    flat: bool = False,
    jittered: list[float] | None = None,
) -> list[float]:
    """Each gradient leaf's budget: C_PROBE x C_EST x its measured noise, above float32's floor (the
    error model's own, at float32 compute) and the collective's rounding. Where the probes cut
    the rows (`flat`: the sides split only the batch's rows), those probes see only the sums
    over rows, and the sides' compilers also round inside a row where the other does not: each
    leaf's budget then holds C_FLIP x the noise of those roundings' flips (`flips`, from
    `jittered`: the same leaf's noise under the probes that jitter every site), or, where those
    probes could not run, the error model's flat budget (about 4.4% of a leaf under dp)."""
    import dataclasses

    floor = dataclasses.replace(model, compute='float32', reduce='float32').gradients()
    reduce = model.gradients() - dataclasses.replace(model, reduce='float32').gradients()
    found = [C_PROBE * C_EST * n + floor + max(reduce, 0.0) for n in noise]
    if flat and jittered is None:
        return [max(x, model.gradients()) for x in found]
    if flat:
        return [x + C_FLIP * f for x, f in zip(found, flips(jittered, model.compute), strict=True)]
    return found


def loss(model: numerics.Budget, sensitivity: float, cast: float, noise: float,
         jittered: bool) -> float:  # fmt: skip
    """A loss metric's budget, each term relative to |loss|: where the probes `jittered` every
    site and measured its `noise`, from that noise and `cast`, above float32's floor and the
    flips' terms; else the error model's, from its first-order `sensitivity`, plus
    C_LOSS x `cast`, at least the probes' noise as a gradient leaf's (the module docstring)."""
    if jittered and noise:
        return C_LOSS_NOISE * noise + C_LOSS_CAST * cast + model.loss(0.0)
    return max(model.loss(sensitivity) + numerics.C_LOSS * cast, C_PROBE * C_EST * noise)


def flip(compute: str) -> float:
    """A flip's noise over a jitter's, per element: where two programs compute a value to
    float32's rounding apart (XLA rewrote one's x / s as x * (1 / s), or fused it otherwise),
    its rounding to `compute` differs with probability about p = u(float32) / u(compute), and
    then by one spacing of `compute` (2 u |x|), where a probe's jitter moves it by u |x| r:
    2 sqrt(p), 2^-7 in bf16."""
    return 2 * math.sqrt(numerics.unit_roundoff('float32') / numerics.unit_roundoff(compute))


def flips(jittered: list[float], compute: str) -> list[float]:
    """Each gradient leaf's expected noise from such flips where the sides split only the rows
    (each row's arithmetic the same program, compiled apart): flip(compute) x the leaf's noise
    under the probes that jitter every site (probes.measure, rows=0). One device against
    explicit/dp.py on data:2, bf16 (seeds 3-5, 100 steps from initialisation and from 300
    trained steps; docs/numerics.md, "Flips under dp"): a flip on 22% of steps, each leaf's
    error over this estimate at most 6.75 (the 99th percentile of the steps with a flip 5.5)."""
    factor = flip(compute)
    return [factor * n for n in jittered]


def cast(grads, params, dtype: str) -> float:
    """How far a loss moves, to first order, where one side uses the float32 parameters that
    the other rounds to `dtype` first: sum over leaves of |g . (p - p in dtype)|, g the loss's
    gradient (A's). XLA may keep a cast parameter in float32 (excess precision) in one program
    and not in another: after the first AdamW step the parameters are no longer bf16 numbers,
    and a step smaller than bf16's spacing is exactly what the cast drops, against the
    gradient, so the terms add up rather than cancel (one device against explicit on
    data:2,fsdp:2,model:2 at 3e-3: the loss 1.1e-4 to 2.3e-4 apart over steps 1-7, that
    first-order sum 1.0e-4 to 2.3e-4, the sides 2e-6 to 6e-6 apart once both are given the
    rounded parameters). Per leaf in absolute value: a program keeps or rounds a leaf's cast."""
    import jax.numpy as jnp

    total = 0.0
    for (_, g), (_, p) in zip(named_leaves(grads), named_leaves(params), strict=True):
        p = np.asarray(p)
        if jnp.dtype(dtype).itemsize >= p.dtype.itemsize or not np.issubdtype(p.dtype, np.floating):
            continue
        dropped = p.astype(np.float64) - np.asarray(jnp.asarray(p).astype(dtype), np.float64)
        total += abs(float(np.sum(np.asarray(g, np.float64) * dropped)))
    return total


def rounded(params, dtype: str):
    """`params` with every float leaf wider than `dtype` rounded to it (kept in its own dtype),
    or None where that changes nothing (float32 compute, or the parameters already `dtype`'s
    numbers): what a program that rounds its cast parameters computes with."""
    import jax
    import jax.numpy as jnp

    def cut(p):
        p = np.asarray(p)
        if not np.issubdtype(p.dtype, np.floating) or jnp.dtype(dtype).itemsize >= p.itemsize:
            return p
        return np.asarray(jnp.asarray(p).astype(dtype).astype(p.dtype))

    out = jax.tree.map(cut, params)
    same = all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(out)))
    return None if same else out


def moved(grads, at_rounded) -> list[float]:
    """Each gradient leaf's norm-wise move where A's own program is given the parameters rounded
    to the compute dtype (`rounded`): the gradient's counterpart of `cast`, per leaf."""
    pairs = zip(named_leaves(grads), named_leaves(at_rounded), strict=True)
    return [
        numerics.error(np.asarray(a, np.float64), np.asarray(b, np.float64))
        for (_, a), (_, b) in pairs
    ]


def norm_moved(grads, at_rounded) -> float:
    """The global norm's relative move where A's program is given the rounded parameters
    (`moved`'s counterpart for the norm that AdamW's clip divides by)."""
    size = global_norm(grads)
    return abs(global_norm(at_rounded) - size) / size if size else 0.0


def step_floor(after, step, eps: float = STEP_EPS) -> float:
    """The norm-wise error two correct steps of size `step` reach once stored as float32 next
    to `after`: C_STEP (eps + sqrt(eps q)), q = ||ulp(after)|| / ||step||."""
    size = float(np.linalg.norm(step))
    if not size:
        return 0.0
    ulp = np.spacing(np.abs(np.asarray(after, np.float32))).astype(np.float64)
    return C_STEP * (eps + math.sqrt(eps * float(np.linalg.norm(ulp)) / size))


def compare_steps(prefix, a, b, before, budget, seen=None, limits=None) -> list[Leaf]:
    """The leaves of the states a and b (after one step from `before`) whose steps differ:
    each leaf's step (a - before against b - before), norm-wise against budget(before, b's
    leaf, path, b's step) (a relative error of the step). An integer leaf (the step count)
    differs at any difference; a leaf stored in another dtype is a difference whatever its
    values. `limits`: {path: budget}, each leaf's detection limit."""
    out = []
    olds = [x for _, x in named_leaves(before)]
    pairs = zip(named_leaves(a), named_leaves(b), olds, strict=True)
    for (path, x), (_, y), old in pairs:
        name = f'{prefix}{path}'
        if np.dtype(x.dtype) != np.dtype(y.dtype):
            kinds = (np.dtype(x.dtype).name, np.dtype(y.dtype).name)
            out.append(Leaf(name, math.inf, math.inf, dtypes=kinds))
            continue
        if not np.issubdtype(np.dtype(x.dtype), np.floating):
            leaf = compare(name, x, y, 'bitwise')
            out += [leaf] if leaf else []
            if seen is not None:
                seen.append((name, math.inf if leaf else 0.0))
            continue
        old = np.asarray(old, np.float64)
        sx, sy = np.asarray(x, np.float64) - old, np.asarray(y, np.float64) - old
        allowed = budget(old, y, path, sy)
        if limits is not None:
            limits[path] = max(limits.get(path, 0.0), allowed)
        leaf = compare(name, sx, sy, 'model', budget=allowed, seen=seen)
        out += [leaf] if leaf else []
    return out


def f32_step(old, after, path, step) -> float:
    """--tolerance=f32: a step within float32's discrepancy of two programs and its storing."""
    return step_floor(after, step)


def x64_step(old, after, path, step) -> float:
    """--x64: the same at float64's (a step stored in float64)."""
    size = float(np.linalg.norm(step))
    ulp = np.spacing(np.abs(np.asarray(after, np.float64)))
    eps = 1e-12
    return C_STEP * (eps + math.sqrt(eps * float(np.linalg.norm(ulp)) / size)) if size else 0.0


def carried(step, term, old) -> float:
    """||the gradient's term in a moment's step|| / ||step||: AdamW's step of a moment is
    beta' term - alpha old (term = g or g^2, the clip's factor and 1 - beta in beta'; alpha = 1 -
    beta), solved for both by least squares, so a step in which the new term nearly cancels the
    old moment (a trained state's steady gradient) carries the term's rounding at its size."""
    size = float(np.linalg.norm(step))
    if not size:
        return 1.0
    basis = np.stack([np.ravel(term), -np.ravel(old)], 1)
    (beta, _), *_ = np.linalg.lstsq(basis, np.ravel(step), rcond=None)
    return max(1.0, abs(beta) * float(np.linalg.norm(term)) / size)


def update(model: numerics.Budget, grads: dict, apply, values: dict, clip: float | None = None):
    """budget(before, after, path, step) of a leaf's step under the error model: a parameter's
    C_MOVED x how far the optimizer's step moves it when its gradient carries the rounding the
    probes measure on A (`apply()`: numerics.spread of A's gradients at the probes' spread of
    each element, C_EST x it, computed once, at the first parameter), over the step's size;
    AdamW's moment of order k, k x C_MOMENT x its gradient's budget (`grads` {path: budget}) x
    the share of the step its gradient's term carries (`carried`, `values` {path: A's
    gradient}); a leaf without a gradient the square-root law (numerics' Budget.update); each
    above the storing floor. Each is widened by the global norm's budget (the clip's factor,
    which scales every leaf): `clip`, that norm's budget as a leaf's, from its own noise under
    the probes (probes.Measured.norm); where they could not run (None), every leaf's budget
    weighted by its size, as if each leaf's rounding lay along its gradient (an upper bound:
    the tiny transformer after 1,000 steps, 0.36 of the step against the measured 0.09)."""
    budgets, moved = grads, {}
    paths = ['params.' + p for p in budgets]
    overall = clip
    if overall is None:  # the clip scales every leaf by one factor, from the global norm
        sizes = {p: float(np.linalg.norm(np.asarray(g, np.float64))) for p, g in values.items()}
        total = math.sqrt(sum(x * x for x in sizes.values())) or 1.0
        overall = math.sqrt(sum((budgets[p] * sizes[p]) ** 2 for p in sizes)) / total

    def budget(before, after, path, step):
        floor = step_floor(after, step)
        size = float(np.linalg.norm(step))
        base = path.split('.', 1)[1] if '.' in path else path
        key = max((k for k in budgets if f'.{base}'.endswith(f'.{k}')), key=len, default=None)
        for tag, order in (('.mu.', 1), ('.nu.', 2)):
            if tag in f'.{path}.' and key is not None:
                share = carried(step, np.asarray(values[key], np.float64) ** order, before)
                return numerics.C_MOMENT * order * (budgets[key] + overall) * share + floor
        if path in paths:
            if not moved:
                moved.update(zip(paths, apply(), strict=True))
            # ...and the clip's factor, which the spread's random signs barely move
            return C_MOVED * moved[path] / size + overall + floor if size else floor
        return numerics.C_UPDATE * math.sqrt(max(budgets.values(), default=0.0)) + floor

    return budget
