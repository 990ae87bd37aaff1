"""The error model (docs/numerics.md): how far apart two correct runs of one step may sit when
they round differently, per compared quantity, as a norm-wise relative budget.

The statistic, one figure per leaf (never per element: one element in a million of a correct
bf16 pair is off by 1e3 relative):

    error(a, b) = ||a - b|| / max(||a||, ||b||)        (2-norms over the leaf, in float64)

The budget, from the plan's precision and the program. Two runs that differ only in rounding
(another mesh, another fusion, XLA's excess precision keeping one twin's intermediate in f32
where another rounds it) differ at each op's boundary by about one unit round-off u of the dtype
that boundary is rounded to. Dots accumulate in float32 (on the CPU, GPU tensor cores, the TPU's
MXU), so a contraction of length K costs one rounding of its result, not K u. Independent
roundings add as a random walk (Higham's probabilistic bound), so after n boundaries

    budget = C_OP x u(compute) x sqrt(n)  +  C_REDUCE x u(reduce) x sqrt(log2(d) + 1)
                                           +  C_OP x u(float32) x sqrt(n)

with n the boundaries the quantity has passed (the k-th module output of the forward: k x
BOUNDARIES; a gradient: the forward's and the backward's, twice as many), and d the devices a
gradient's collective reduces over (a ring or tree adds a rounding per hop, log2(d) + 1 of them
in a tree; a per-device sum of its own rows is one more). A loss metric gets each output's
rounding carried to it by its measured first-order sensitivity (`Budget.loss`). After the
update, AdamW's moments get the gradients' budget x their order x the share of the leaf this
step changed (`Budget.moment`), and a parameter C_MOVE x how far the optimizer's own step
moves it when its gradient carries the rounding the two sides measure (`spread`,
`Budget.parameters`: sign flips at AdamW's first step, damped by m and v after it). A leaf
whose gradient is not at hand gets sqrt(the gradients' budget) (`Budget.update`). Along a
trajectory (tools/compare/cli.py's band) the difference of two correctly rounded runs grows with
the step: `band`.

The constants are calibrated by measurement (benchmarks/numerics.py; its table is
docs/numerics.md's): correct pairs sit at most 1/3 of the budget, their median within a factor
30 of it, and the bug zoo's entries exceed it 10 times and more.

Core: no twin, tool or benchmark imports (parity_tests/test_imports.py)."""

import dataclasses
import math

import jax
import numpy as np

UNIT_ROUNDOFF = {  # u = 2^-p for p bits of significand (the implicit one counted)
    'float64': 2.0**-53,
    'float32': 2.0**-24,
    'bfloat16': 2.0**-8,
    'float16': 2.0**-11,
}

# The model's named constants (docs/numerics.md, "Calibration"): measured, not derived.
C_OP = 2.5  # norm-wise relative error per op boundary of the forward, in units of u
BOUNDARIES = 2  # op boundaries (roundings) per recorded module output
C_GRAD = 1.2  # ...of the backward (a gradient), in units of u
C_LOSS = 3.0  # a loss metric: x each output's rounding carried to it (`Budget.loss`)
C_FLIP = 1.5  # a gradient after flips: C_FLIP x sqrt(flipped tokens / tokens)
C_FLIP_LOSS = 0.1  # a loss metric after flips: C_FLIP_LOSS x flipped tokens / tokens (one case)
C_ACC = 2.0  # a forward output: float32's accumulation in another order, x u(f32) sqrt(K)
C_REDUCE = 3.0  # per hop of a gradient's collective, in units of the reduce dtype's u
C_MOMENT = 1.0  # AdamW's moments: order x the gradients' budget x the leaf's change
C_UPDATE = 2.5  # a leaf after the update, no gradient at hand: x sqrt(gradients' budget)
C_MOVE = 10.0  # a parameter after the update: x how far its gradient's rounding moves it (`spread`)
# Along a trajectory (compare's band), relative to the figure:
#     band(step) = BAND_0 x u x min((1 + step / BAND_STEPS)^BAND_POWER, BAND_CAP)
# fitted to auto against explicit (bf16, data:2,fsdp:2,model:2), 100 and 300 steps.
BAND_0 = 0.12
BAND_STEPS = 2.0
BAND_POWER = 1.0
BAND_CAP = 35.0  # ...growing no further: the gap of two correct runs levels off (300 steps)


def unit_roundoff(dtype: str) -> float:
    try:
        return UNIT_ROUNDOFF[str(dtype)]
    except KeyError:
        raise ValueError(f'no unit round-off for dtype {dtype!r}: one of {list(UNIT_ROUNDOFF)}')


def coarser(*dtypes: str) -> str:
    """The dtype with the largest unit round-off (float32 at least)."""
    return max(('float32', *map(str, dtypes)), key=unit_roundoff)


def coarsest(policies) -> tuple[str, str]:
    """(compute, reduce): the coarser of each over (compute, reduce) pairs, one per side or run."""
    computes, reduces = zip(*policies, strict=True) if policies else ((), ())
    return coarser(*computes), coarser(*reduces)


def saved(model_config: dict) -> tuple[str, str]:
    """A run's (compute, reduce) from its config.json's model_config (float32 where a run saved
    before the policy recorded none)."""
    return model_config.get('dtype', 'float32'), model_config.get('reduce_dtype', 'float32')


def widest(params) -> int:
    """K, the longest contraction a model's dots run: the largest input dimension (the last
    but one) of its weights of two dimensions or more (stacked layers' and experts' too)."""
    return max([x.shape[-2] for x in jax.tree.leaves(params) if np.ndim(x) >= 2] or [1])


def error(a, b) -> float:
    """||a - b|| / max(||a||, ||b||) over the leaf, in float64: 0 where both are zero, inf where
    the shapes differ or either holds a NaN or infinity."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return math.inf
    scale = max(float(np.linalg.norm(a)), float(np.linalg.norm(b)))
    return float(np.linalg.norm(a - b)) / scale if scale else 0.0


@dataclasses.dataclass(frozen=True)
class Budget:
    """The budgets of one step's quantities for two sides, from the coarser of their policies.

    compute, reduce: the coarser side's dtypes; devices: the most devices a gradient is reduced
    over on either side; modules: how many module outputs the forward records (its depth)."""

    compute: str = 'float32'
    reduce: str = 'float32'
    devices: int = 1
    modules: int = 1
    terms: int = 1  # the loss is a mean of this many terms (rows x positions)
    contraction: int = 1  # K, the longest contraction of the model's dots (`widest`)
    flipped: float = 0  # tokens whose expert choice flipped in this step's forward (`flips`),
    # or are expected to where the forward cannot see the layer (`expected_flips`)

    @classmethod
    def of(cls, precisions, devices: int = 1, modules: int = 1) -> 'Budget':
        """The budget of sides with `precisions` (shard_parity.plan.Precision each)."""
        return cls(
            *coarsest([(p.compute, p.reduce) for p in precisions]),
            max(devices, 1),
            max(modules, 1),
        )

    @property
    def name(self) -> str:
        """The coarser dtype, as the verdict names its round-off: 'bf16', 'f32'."""
        dtype = coarser(self.compute, self.reduce)
        return {'bfloat16': 'bf16', 'float32': 'f32', 'float16': 'f16'}.get(dtype, dtype)

    def _ops(self, n: float, c: float = C_OP) -> float:
        return c * (unit_roundoff(self.compute) + unit_roundoff('float32')) * math.sqrt(n)

    def _reduce(self) -> float:
        hops = math.log2(self.devices) + 1 if self.devices > 1 else 0
        return C_REDUCE * unit_roundoff(self.reduce) * math.sqrt(hops)

    def forward(self, k: int) -> float:
        """The k-th (from 1) module output of the forward, in the order they finish: its
        boundaries, and float32's accumulation of a contraction of K terms in another order (a
        dot split over 'model' or 'fsdp' adds partial sums; another fusion another tiling),
        C_ACC u(f32) sqrt(K), which no boundary counts: it alone is the whole budget where
        compute is float32 and only the reduction is narrower (a fuzzer find, 2026-12-05)."""
        accumulate = C_ACC * unit_roundoff('float32') * math.sqrt(self.contraction)
        return self._ops(BOUNDARIES * max(k, 1)) + accumulate

    def loss(self, sensitivity: float, count: float | None = None) -> float:
        """A loss metric: each module output's rounding (C_OP u sqrt(BOUNDARIES), independent
        per element), carried to the metric to first order: `sensitivity` = sqrt(sum over the
        outputs of ||dm / d eps||^2) / |m| for relative noise eps at each output, measured on the
        step's batch and weights (tools/bisect/intercept.py's `sensitivities`, over the larger |m| of
        the two sides). A mean of T terms averages it as sqrt(T) and a cross-entropy damps it
        by the logits' size against the loss; both are in it, measured, where a constant fitted on one model at 256 terms
        overstated the averaging at 4 by 7 times and left the MLP's loss 1.4 budgets over (a
        fuzzer find, 2026-12-05: tools/fuzz/corpus/bisect_loss_budget_few_terms.json). Then
        float32's own rounding, which no mean cancels: the sides' float32 sums run in other
        orders through every module (a float32 compute with a bf16 reduce once got a budget
        of a tenth of one float32 ulp: fuzzer, 2026-12-05, bisect_loss_budget_below_f32). After
        F flips, F of the mean's terms come from other experts' outputs: C_FLIP_LOSS x F /
        terms more (a fuzzer find, 2026-12-05: typed on model:8, one flip in 16 tokens moved
        the loss by 1.0e-3 and the router's auxiliary loss by 1.6e-3, 1.8 and 2.8 budgets
        without it; tools/fuzz/corpus/bisect_loss_after_a_flip.json). A count (`count` = its
        value |m|, a share of terms each 0 or 1, such as the experts' dropped share; its
        sensitivity is 0) moves by one term per flip, F / (terms |m|) relative: a flipped token
        takes a slot in its new expert's queue, and one token there may be dropped for capacity
        (a fuzzer find, 2026-12-06: explicit on data:8 with 2 experts at capacity 1.25, 3 flips
        in 128 tokens moved the dropped share by 1.4%, 6.1 budgets over without it;
        tools/fuzz/corpus/bisect_flips_move_the_dropped_share.json)."""
        carried = C_LOSS * self._ops(BOUNDARIES) * sensitivity
        flips = C_FLIP_LOSS * self.flipped / self.terms  # a flipped token's term is another's
        if count:
            flips += self.flipped / (self.terms * count)
        return (carried + C_OP * unit_roundoff('float32') * math.sqrt(BOUNDARIES * self.modules)
                + flips)  # fmt: skip

    def gradients(self) -> float:
        """Each gradient leaf: the forward's boundaries and the backward's, then the collective."""
        flips = C_FLIP * math.sqrt(self.flipped / self.terms)  # their gradients went elsewhere
        return self._ops(2 * BOUNDARIES * self.modules, C_GRAD) + self._reduce() + flips

    def moment(self, change: float, order: int) -> float:
        """AdamW's moment of `order` (1: m, 2: v) after the step: the term it added is
        (1 - beta) g^order, whose relative error is `order` times the gradient's, so the budget
        is linear in the gradients' (a parameter's goes through the optimizer: `parameters`)."""
        return C_MOMENT * order * self.gradients() * change + C_OP * unit_roundoff('float32')

    def parameters(self, moved: float) -> float:
        """A parameter after the step, `moved` = how far the optimizer's step moves it when its
        gradient carries the rounding the two sides measure, relative to its norm (`spread`
        over ||after||): the step itself (AdamW at its count, the clip, the schedule) carries
        the gradient's rounding into the parameter, sign flips and all, so the budget is a
        multiple of that, plus float32's rounding of the sum."""
        return C_MOVE * moved + C_OP * unit_roundoff('float32')

    def update(self, change: float = 1.0) -> float:
        """A leaf of the state after the update where its gradient is not at hand (a
        checkpoint's state, run directories; with the gradients, `moment` and `parameters`
        take it): the error of what the step added, `change` = ||after - before|| / ||after||
        of the leaf (the magnitude of the term, not of the result), plus float32's rounding of
        the sum. AdamW's first steps are sign-like (m / sqrt(v) = g / |g|): an element whose
        gradient is within round-off of zero flips its update, and the fraction that flips is
        about the gradients' relative error e, so the update's norm-wise error goes as
        sqrt(e), not e."""
        return C_UPDATE * math.sqrt(self.gradients()) * change + C_OP * unit_roundoff('float32')

    def along(self, step: int) -> float:
        """A figure of two runs after `step` steps: `band`."""
        return band(self.compute, self.reduce, step)


SPREAD_NODES = 8  # Gauss-Hermite nodes of `spread`: one optimizer update each
FLIP_Z = 4.0  # an element within FLIP_Z sigma of zero may flip (Gaussian: 6e-5 beyond)


def spread(update, grads, other, nodes: int = SPREAD_NODES, flip_z: float = FLIP_Z,
           sigmas=None, turns=None) -> list[float]:  # fmt: skip
    """How far the optimizer's step moves each leaf when the gradients carry the rounding the
    two sides measure: `update` maps a gradient tree to the parameters after the step, `grads`
    and `other` are the two sides' gradients. Each element's rounding is taken as Gaussian at
    its leaf's measured scale, sigma = ||grads - other|| / sqrt(N) over the N elements either
    side's gradient reached (the magnitudes measured on the terms, not assumed), and

        moved = sqrt(E ||update(grads + noise) - update(grads)||^2)

    per leaf, the expectation by Gauss-Hermite quadrature in `nodes` updates: at node z_k every
    element gets sigma z_k with a sign of its own (fixed, so that no common shift moves a global
    norm), which is each element's own quadrature, the nodes being symmetric. Through the
    optimizer itself (AdamW at its step count, the clip, the learning rate's schedule): at
    AdamW's first step, sign-like (m / sqrt(v) = g / |g|), an element of size |g_i| flips its
    update with probability erfc(|g_i| / (sigma sqrt 2)) / 2 and then moves by twice its size,
    so moved = 2 sqrt(the share flipped) x the update's norm; from the second step on, m and v
    hold earlier gradients and damp it (the newest one's weight in AdamW's bias-corrected m is
    (1 - b1) / (1 - b1^t), 0.53 at t = 2): on the tests' transformer a sign-like law at t = 2
    reads about 9 times what the step moves (docs/numerics.md).

    A mean is not a count: where a leaf expects less than one flip, one flip still comes now
    and then, and it moves the leaf by far more than the mean says (a fuzzer find, 2026-12-05:
    an MLP bias element summed to exactly 0 in bf16 on one side, -8.7e-5 on the other, 2.9
    sigma of its leaf, and its first AdamW step went from the learning rate to 0: 33 times
    the mean). So moved is at least the largest move one element makes when its gradient
    turns, among the elements within `flip_z` sigma of zero (one more update).

    `sigmas` (one per leaf: a number, or an array of the leaf's shape, each element's own),
    where given, are the elements' scales instead: the bisector's, from side A's probes alone
    (tools/bisect/probes.py); `other` is then unused. Per element, because a rounding's tail is
    not Gaussian at its leaf's RMS: at AdamW's first step an element of |g| near AdamW's eps
    whose terms cancel moved 17% of the learning rate, 20 leaf-RMS sigmas out (the transformer
    under dp, bf16, no warm-up). `turns` (as `sigmas`), where given, are the scales that
    decide which elements may turn for that floor: a rare, concentrated rounding (a flip,
    tools/bisect/budgets.py) moves an element far beyond its RMS."""
    leaves, treedef = jax.tree.flatten(grads)
    leaves = [np.asarray(g, np.float32) for g in leaves]
    others = [np.asarray(o, np.float32) for o in jax.tree.leaves(other if sigmas is None
                                                                 else grads)]  # fmt: skip
    rng = np.random.default_rng(0)
    given, sigmas, signs = sigmas, [], []
    for i, (g, o) in enumerate(zip(leaves, others, strict=True)):
        summed = (g != 0) | (o != 0)  # an element no term reached (an unseen token's row) is 0
        n = int(summed.sum())  # on both sides, exactly: no rounding
        sigma = float(np.linalg.norm((g - o).astype(np.float64))) / math.sqrt(max(n, 1))
        sigmas.append(sigma if given is None else given[i])
        signs.append(rng.choice(np.array([-1, 1], np.float32), size=g.shape) * summed)
    base = [np.asarray(x, np.float64) for x in jax.tree.leaves(update(grads))]
    if not any(np.any(s) for s in sigmas):
        return [0.0] * len(base)
    z, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / w.sum()
    acc = [0.0] * len(base)
    for zk, wk in zip(z, w):
        noisy = [g + np.float32(s * zk) * r for g, s, r in zip(leaves, sigmas, signs)]
        moved = jax.tree.leaves(update(jax.tree.unflatten(treedef, noisy)))
        for i, (x, b) in enumerate(zip(moved, base)):
            acc[i] += wk * float(np.sum((np.asarray(x, np.float64) - b) ** 2))
    # ...and at least what one plausible flip makes: where a leaf expects less than one flip,
    # the mean understates the flip that does come (a count of 0 or 1, not its mean)
    turned = [np.where((r != 0) & (np.abs(g) <= flip_z * s), -g, g)
              for g, s, r in zip(leaves, sigmas if turns is None else turns, signs)]  # fmt: skip
    one = jax.tree.leaves(update(jax.tree.unflatten(treedef, turned)))
    return [max(math.sqrt(a), float(np.max(np.abs(np.asarray(x, np.float64) - b), initial=0)))
            for a, x, b in zip(acc, one, base)]  # fmt: skip


def expected_flips(margins, rounding: float) -> float:
    """The expected number of tokens whose top-k choice rounding flips, where a mixture of
    experts runs out of the forward's sight (inside a pipeline): `margins` [..., 2] each token's
    router margin at its top-k boundary and the scale s of its noise (tools/bisect/divergence.py's
    `margins`), `rounding` the relative error its input carries. The margin moves by Gaussian
    noise of sigma = rounding x s, and the token flips where the noise crosses it:
    P = erfc(margin / (sigma sqrt 2)) / 2, summed over the tokens."""
    m = np.asarray(margins, np.float64).reshape(-1, 2)
    gap, sigma = np.abs(m[:, 0]), m[:, 1] * rounding
    ok = np.isfinite(gap) & (sigma > 0)
    if not ok.any():
        return 0.0
    return float(np.sum(_crossed(gap[ok], sigma[ok])))


def _crossed(size, sigma) -> np.ndarray:
    """The probability that Gaussian noise of `sigma` moves a value of `size` (>= 0) across
    zero, one way: erfc(size / (sigma sqrt 2)) / 2 (a gradient's sign, a router's margin)."""
    return _erfc(size / (sigma * math.sqrt(2))) / 2


def _erfc(x: np.ndarray) -> np.ndarray:
    """erfc for x >= 0, to 1.2e-7 relative (Numerical Recipes' Chebyshev fit): numpy has none."""
    t = 1 / (1 + x / 2)
    poly = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
            -1.13520398, 1.48851587, -0.82215223, 0.17087277)  # fmt: skip
    acc = np.zeros_like(x)
    for c in reversed(poly):
        acc = acc * t + c
    return t * np.exp(-x * x + acc)


def change(before, after) -> float:
    """||after - before|| / max(||after||, ||before||): how much of a leaf one step changed."""
    return error(before, after) if np.shape(before) == np.shape(after) else 1.0


def band(compute: str, reduce: str, step: int) -> float:
    """The relative band of a logged figure (a loss) at `step` for two runs whose coarser
    policy is (compute, reduce): two correct runs' |a - b| / |b| stays under it."""
    u = unit_roundoff(compute) + unit_roundoff(reduce) + unit_roundoff('float32')
    return BAND_0 * u * min((1 + max(step, 0) / BAND_STEPS) ** BAND_POWER, BAND_CAP)


FLIP_LOOK = 1 / 3  # a MoE output past this share of its budget is searched for flips
FLIP_SHARE = 0.02  # at most this share of a mixture-of-experts layer's tokens may flip
# ...each moving two more tokens, which capacity drops or lets in (fuzz corpus, 2026-12-07:
# bisect_flip_displaces_a_token.json, 3 tokens of 128 where 2 were allowed)
FLIP_MOVES = 3


def tokens(x) -> np.ndarray:
    """A layer output as (tokens, features): every leading dimension is a token's."""
    x = np.asarray(x, np.float64)
    return x.reshape(-1, x.shape[-1]) if x.ndim >= 2 else x.reshape(-1, 1)


def flips(a, b, budget: float, share: float = FLIP_SHARE, most: int | None = None) -> set | None:
    """The tokens whose expert choice flipped, where a mixture-of-experts layer's outputs a and
    b are apart by more than `budget` only because of them: bf16 rounding can move a token's
    router logits across its top-k boundary, and then that token's output is another expert's,
    far beyond round-off, while every other token agrees. Removing the worst tokens one by one
    until the rest sit within `budget`: those tokens, if at most FLIP_MOVES x `share` of them
    (at least FLIP_MOVES: a flip and the two tokens capacity may drop or let in for it), or at
    most `most` where given (the flips a count expects: `plausible`); None where more would
    have to go (a bug spreads over the tokens)."""
    ta, tb = tokens(a), tokens(b)
    if ta.shape != tb.shape:
        return None
    worst = np.argsort(-((ta - tb) ** 2).sum(1))
    keep = np.ones(len(ta), bool)
    limit = FLIP_MOVES * max(1, int(share * len(ta))) if most is None else most
    for n, t in enumerate(worst[:limit], 1):
        keep[t] = False
        if error(ta[keep], tb[keep]) <= budget:
            return {int(i) for i in worst[:n]}
    return None


PLAUSIBLE_TAIL = 1e-4  # a count of flips beyond which a Poisson count has less than this left


def plausible(expected: float, tail: float = PLAUSIBLE_TAIL) -> int:
    """The most flips a Poisson count of mean `expected` reaches but for `tail` of its draws:
    where rounding flips tokens out of the forward's sight (`expected_flips`), the tokens the
    first output seen after them may lose. A mean is not a count: 0.05 expected makes 2
    plausible, 1 makes 6; 0 makes none."""
    if expected <= 0:
        return 0
    n, below = 0, 0.0  # P(N <= n), its terms in logs: exp(-expected) underflows from 745
    while True:
        below += math.exp(n * math.log(expected) - expected - math.lgamma(n + 1))
        if 1 - below < tail:  # P(N > n)
            return n
        n += 1


def without(x, gone: set) -> np.ndarray:
    """x as (tokens, features) with the tokens in `gone` zeroed (left out of both sides' norms),
    or x itself where its tokens are not the flipped ones' (another leading shape)."""
    t = tokens(x)
    if not gone or max(gone) >= len(t):
        return np.asarray(x)
    t = t.copy()
    t[sorted(gone)] = 0
    return t
