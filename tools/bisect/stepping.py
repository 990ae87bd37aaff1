"""One step of the bisector (tools/bisect/divergence.py): both sides run it from the same
state on the same batch, compared phase by phase (forward, gradients, update), each leaf to
its tolerance (tools/bisect/leaves.py) or, under --tolerance=model, to its budget in
shard_parity/numerics.py's error model. A Runner holds one side's compiled functions; the
outputs come from tools/bisect/intercept.py's interceptors, run inside the side's own
eval_step (its own placement and shard_map). Where 'seq' splits positions, compare_step
compares no output at all: a side holds them in its own layout.
"""

import dataclasses
import functools
import math

import jax
import numpy as np

from shard_parity import numerics
from shard_parity.mesh import SEQ
from shard_parity.plan import DATA, FSDP
from shard_parity.step import bind

from . import budgets, probes
from .intercept import ROUTER, recorded, sensitivities
from .leaves import compare, compare_trees, named_leaves
from .sides import Side, guarded, place


class Runner:
    """One side's compiled functions, built on first use (a bug found in the forward pass never
    compiles the train step)."""

    def __init__(self, side: Side, graphdef, loss_fn, tx, label='A'):
        self.side, self.graphdef, self.loss_fn, self.tx = side, graphdef, loss_fn, tx
        self.names, self.label, self.kinds, self.routers = [], label, {}, {}

    @functools.cached_property
    def forward(self):
        capture = recorded(self.loss_fn, self.names, self.kinds)
        return self.side.module.eval_step(self.graphdef, capture, self.side.mesh, self.side.plan)

    @functools.cached_property
    def grads(self):
        side = self.side
        return side.module.loss_and_grads(self.graphdef, self.loss_fn, side.mesh, side.plan)

    @functools.cached_property
    def step(self):
        side = self.side
        return side.module.train_step(self.graphdef, self.loss_fn, self.tx, side.mesh, side.plan)

    def modules(self, state, batch) -> int:
        """How many modules one device's forward runs (traced, nothing compiled): the error
        model's depth where no output is compared."""
        names = []
        jax.eval_shape(bind(self.graphdef, recorded(self.loss_fn, names)), state.params, batch)
        return max(len([n for n in names if not n.endswith(ROUTER)]), 1)

    @functools.cached_property
    def _sensitivities(self):
        return sensitivities(self.graphdef, self.loss_fn)

    @guarded
    def sensitivity(self, state, batch) -> dict:
        """Each loss metric's first-order sensitivity to the outputs' rounding (`sensitivities`),
        on one device whatever this side's mesh."""
        return self._sensitivities(jax.tree.map(np.asarray, state.params), batch)

    @guarded
    def activations(self, state, batch) -> list:
        out = self.forward(place(self.side, state.params), place(self.side, batch, True))
        pairs = list(zip(self.names, [np.asarray(x) for x in out]))
        self.routers = {n.removesuffix(ROUTER): x for n, x in pairs if n.endswith(ROUTER)}
        return [(n, x) for n, x in pairs if not n.endswith(ROUTER)]

    @guarded
    def loss_and_grads(self, state, batch):
        return jax.device_get(
            self.grads(place(self.side, state.params), place(self.side, batch, True))
        )

    @guarded
    def train_step(self, state, batch):
        return jax.device_get(self.step(place(self.side, state), place(self.side, batch, True)))


def spread_over(a: Side, b: Side, axes: str) -> int:
    """The most devices either side's plan spreads over its `axes` ('rows': how many blocks of
    rows the batch is split into; 'batch_axes': the devices a gradient is reduced over, rows
    and positions)."""
    plans = [s.plan for s in (a, b) if s.mesh]
    return max((math.prod(p.size(x) for x in getattr(p, axes)) for p in plans), default=1)


def beyond_rows(a: Side, b: Side, stacked: bool) -> bool:
    """Whether a row's own arithmetic may differ between the sides: either splits more than the
    batch's rows over 'data', or 'fsdp' where the model has no `stacked` layers (fsdp runs the
    transformer's stacked blocks under a scan with remat; tensor, sequence, pipeline or expert parallelism), or is not one device or an
    explicit/ file (or a module planted on one, tools/zoo): the compiler's partitioner (auto/,
    typed/) fuses each row's ops its own way. Each put the transformer's final norm scale
    64-67 budgets over at row-only budgets (auto and typed dp, explicit fsdp). Then the
    probes jitter every site, else they cut the rows into blocks (probes.measure)."""
    for side in (a, b):
        if side.mesh is None:
            continue
        module = getattr(side.module, 'ORIGINAL', side.module)
        if not getattr(module, '__name__', '').startswith(('explicit.', 'shard_parity.explicit')):
            return True
        rows = (DATA,) if stacked else (DATA, FSDP)
        if any(side.mesh.shape[ax] > 1 for ax in side.mesh.axis_names if ax not in rows):
            return True
    return False


class Seen(list):
    """The (leaf, error / budget) pairs of one phase, into the report's worst and seen."""

    def __init__(self, report, phase):
        super().__init__()
        self.report, self.phase = report, phase

    def append(self, item):
        path, fraction = item
        self.report.seen.append((self.phase, path, fraction))
        worst = self.report.worst.get(self.phase)
        if worst is None or not fraction <= worst[1]:
            self.report.worst[self.phase] = [path, fraction]


def _probed(ra: Runner, report, step, state, batch, rows: int):
    """(A's probes at `rows`, and where they cut the rows the probes that jitter every site, or
    None): each a (spread, noise, elements) of probes.measure, or None where it could not run
    (a note says so). Cut rows see only the sums over rows; the jittered probes' noise, scaled
    to a flip's (budgets.flips), is each row's own rounding that the sides' compilers may make
    apart: one clean and PROBES more passes of A per step (docs/numerics.md, "Flips under dp")."""
    what = f"step {step}: the probes could not run A's step"
    args = (ra.graphdef, ra.loss_fn, state.params, batch)
    probed = probes.measured_or_noted(report, what, *args, rows=rows)
    if probed is None or not rows:
        return probed, None
    return probed, probes.measured_or_noted(report, f'{what} jittered', *args, rows=0)


def compare_step(ra: Runner, rb: Runner, apply, state, batch, tolerance, report, step=None):
    """(phase, layer, differing leaves) of one step from `state`, or (None, None, A's state)."""
    n = spread_over(ra.side, rb.side, 'rows')
    common, acts_a, acts_b = [], [], {}
    # Under 'seq' a side's per-example outputs hold its positions in its layout (zigzag's
    # chunks reordered), which have no counterpart in the other's: the loss and gradients speak
    if not any(s.mesh and s.plan.size(SEQ) > 1 for s in (ra.side, rb.side)):
        acts_a, acts_b = ra.activations(state, batch), dict(rb.activations(state, batch))
        common = [(p, x) for p, x in acts_a if p in acts_b]
    report.compared['forward'] = len(common)
    # each compared output's boundaries: its place in the forward of the side that shows more
    # (a pipeline shows only the outputs after its stages; its final norm is still the last)
    fuller = [p for p, _ in acts_a] if len(acts_a) >= len(acts_b) else list(acts_b)
    boundary = {p: k for k, p in enumerate(fuller, 1)}
    terms = min(np.size(x) for x in jax.tree.leaves(batch))  # the loss's: rows x positions
    # the modules either side runs; under 'seq' (none compared) one device's forward, traced
    depth = len(fuller) or ra.modules(state, batch)
    model = report.model and dataclasses.replace(
        report.model, modules=depth, terms=terms, contraction=numerics.widest(state.params)
    )
    # a mixture of experts that one side runs where the forward cannot see it (inside the
    # other's pipeline): its flips are not counted but expected, from the margins of that side's
    # router (numerics.expected_flips), at the rounding its input carries (a third of its budget)
    risky, hidden, after = 0.0, [], set()
    sides = ((ra, acts_a, acts_b), (rb, list(acts_b.items()), dict(acts_a))) if model else ()
    for side, acts, other in sides:
        hidden = [
            (k, p) for k, (p, _) in enumerate(acts, 1) if p in side.routers and p not in other
        ]
        for k, path in hidden:
            e = numerics.expected_flips(side.routers[path], model.forward(k) * numerics.FLIP_LOOK)
            report.hidden_flips.append([step, path, round(e, 3)])
            risky += e
        if hidden:  # one side's estimate; the outputs both compare after the first of them
            after = {p for p, _ in acts[hidden[0][0] :] if p in other}
            break
    downstream, out_of_sight = set(after), 0  # ...and the hidden flips found there
    seen = {p: Seen(report, p) for p in ('forward', 'loss', 'gradients', 'update')}
    flipped = set()  # tokens whose expert choice bf16 flipped: left out downstream
    for path, x in common:
        y = acts_b[path]
        if flipped:
            x, y = numerics.without(x, flipped), numerics.without(y, flipped)
        allowed = model and model.forward(boundary[path])
        # a few tokens' top-k flipped by rounding? Looked for from a third of the budget (where
        # round-off alone stays), so that a flip is counted, not left inside the budget unsaid;
        # at a mixture of experts, or at the outputs seen after hidden ones (until found there),
        # as many tokens as their expected flips make plausible (numerics.plausible)
        calm = model and allowed * numerics.FLIP_LOOK
        moe = ra.kinds.get(path) == 'MoE'
        if model and (moe or path in after) and numerics.error(x, y) > calm:
            # (flips expected out of sight are searched to the budget itself: a flip there may
            # also move a token that capacity drops or lets in, and after several layers their
            # traces through attention spread a little over the sequence)
            found = (numerics.flips(x, y, calm) if moe else
                     numerics.flips(x, y, allowed, most=numerics.plausible(risky)))  # fmt: skip
            layer = path if moe else f"{', '.join(p for _, p in hidden)}, seen at {path}"
            if found:
                flipped |= found
                report.flips.append([step, layer, len(found)])
                x, y = numerics.without(x, flipped), numerics.without(y, flipped)
                if not moe:  # the hidden layers' flips: found once, expected already
                    after, out_of_sight = set(), len(found)
        leaf = compare(path, x, y, tolerance, n, allowed, seen['forward'])
        if leaf:
            if model and (flipped or path in downstream):  # flips may be what differs here
                report.suspect = [step, risky if path in downstream else 0.0]
            return 'forward', path, [leaf]
    if flipped or risky:  # a flipped token's gradient went to other experts: the gradients' budget
        counted = len(flipped) - out_of_sight + max(out_of_sight, risky)
        model = dataclasses.replace(model, flipped=counted)
    (ma, ga), (mb, gb) = ra.loss_and_grads(state, batch), rb.loss_and_grads(state, batch)
    # each loss metric's first-order sensitivity to the outputs' rounding, on one device, over
    # the larger of the two sides' |m| (a metric that is 0 on both is equal); and every
    # gradient leaf's (and metric's) rounding noise at this state, measured on A alone
    sensitivity = model and ra.sensitivity(state, batch)
    grads = elements = turns = clip = None
    if model:
        stacked = any(p.startswith('blocks.') for p, _ in named_leaves(ga))
        rows = 0 if beyond_rows(ra.side, rb.side, stacked) else max(n, 2)
        probed, jittered = _probed(ra, report, step, state, batch, rows)
        if probed is None:  # (and no clip: the clip's factor from every leaf's budget, by size)
            spread, elements = {}, None
            found = [model.gradients()] * len(named_leaves(ga))
        else:  # rows cut: + the flips of a row's own roundings, or the flat budget (budgets.py)
            spread, noise, elements, norm = probed
            found = budgets.gradients(model, noise, bool(rows), jittered and jittered[1])
            # the global norm that AdamW's clip divides by: a leaf's budget from its own noise
            clip = budgets.gradients(model, [norm], bool(rows), jittered and [jittered.norm])[0]
            if jittered:  # ...which the update's spread carries too, element by element
                factor = budgets.flip(model.compute)
                turns = [np.hypot(e, budgets.C_TURN * factor * j)
                         for e, j in zip(elements, jittered[2])]  # fmt: skip
                elements = [np.hypot(e, factor * j) for e, j in zip(elements, jittered[2])]
        # ...plus, where a row's arithmetic may differ (its casts among it), what A's own
        # gradient moves at the parameters rounded to the compute dtype: a program that keeps a
        # cast parameter in float32 and one that rounds it differ by that (budgets.rounded; one
        # more backward pass of A; none where the parameters are already the dtype's numbers)
        cut = None if rows else budgets.rounded(state.params, model.compute)
        if cut is not None:
            _, gr = ra.loss_and_grads(state._replace(params=cut), batch)
            found = [f + budgets.C_CAST * m for f, m in zip(found, budgets.moved(ga, gr))]
            clip = None if clip is None else clip + budgets.C_CAST * budgets.norm_moved(ga, gr)
        grads = dict(zip([p for p, _ in named_leaves(ga)], found))

    # the differentiated loss also moves where one side keeps a cast parameter in float32 (XLA's
    # excess precision) and the other rounds it: that first-order move, from A's own gradient
    dropped = model and budgets.cast(ga, state.params, model.compute)

    def metric(a, b, path):
        size = max(abs(float(np.asarray(a))), abs(float(np.asarray(b))))
        if not sensitivity[path]:  # a count (the experts' dropped share): a term per flip
            return model.loss(0.0, size)
        probed = spread.get(path, 0.0) if math.isfinite(spread.get(path, 0.0)) else 0.0
        cast = dropped / size if path == 'loss' and size else 0.0
        # the differentiated loss by its own noise where every site was jittered (not rows)
        return budgets.loss(model, sensitivity[path] / size if size else 0.0, cast, probed,
                            path == 'loss' and not rows)  # fmt: skip

    leaves = compare_trees('', ma, mb, tolerance, model and metric, seen['loss'], model and ma)
    if leaves:
        return 'forward', None, leaves
    if model:
        report.limits = {
            'forward': {p: model.forward(boundary[p]) for p, _ in common},
            'loss': {p: metric(x, mb[p], p) for p, x in ma.items()},
            'gradients': grads,
        }
    leaves = []
    for (path, x), (_, y) in zip(named_leaves(ga), named_leaves(gb), strict=True):
        leaf = compare(path, x, y, tolerance, budget=grads and grads[path],
                       seen=seen['gradients'])  # fmt: skip
        leaves += [leaf] if leaf else []
    report.compared['gradients'] = len(leaves) or len(jax.tree.leaves(ga))
    if leaves:
        return 'gradients', None, leaves
    found = (ga, gb, grads, model, elements, turns, clip)
    return _update(ra, rb, apply, state, batch, tolerance, report, found, seen)


def _update(ra, rb, apply, state, batch, tolerance, report, gradients, seen):
    """The update phase: each side's step (new minus old, leaf by leaf) against the shared
    optimizer's step from that side's own gradient (AdamW divides by sqrt(v): gradients equal
    to round-off can give updates that differ far more), and under the error model the two
    sides' steps against each other; relative to the step's own size (budgets.py)."""
    (sa, _), (sb, _) = ra.train_step(state, batch), rb.train_step(state, batch)
    ga, gb, grads, model, elements, turns, clip = gradients
    if tolerance == 'bitwise':  # the states themselves, exactly
        leaves = []
        for prefix, x, y in (('A: ', apply(state, ga), sa), ('B: ', apply(state, gb), sb)):
            leaves += compare_trees(prefix, x, y, tolerance, dtypes=True)
        return ('update', None, leaves) if leaves else (None, None, sa)
    if grads:
        # A's probes cannot see a narrow --reduce_dtype's rounding where A itself does not
        # reduce (one device): the update's spread is then measured between the sides, as before
        # the probes (a fuzzer find, tools/fuzz/corpus/bisect_forward_budget_f32_accumulation)
        narrow = numerics.unit_roundoff(model.reduce) > numerics.unit_roundoff('float32')
        sigmas = None if elements is None or narrow else [budgets.C_EST * e for e in elements]
        turns = turns and sigmas and [budgets.C_EST * t for t in turns]
        budget = budgets.update(model, grads, lambda: numerics.spread(
            lambda g: apply(state, g).params, ga, gb if sigmas is None else None,
            sigmas=sigmas, turns=turns), dict(named_leaves(ga)), clip)
    else:
        budget = budgets.x64_step if tolerance == 'x64' else budgets.f32_step
    limits, leaves = {}, []
    # the policy keeps the parameters and AdamW's state in float32 whatever --dtype says: a
    # leaf stored in another type is a bug even where its numbers are within round-off
    for prefix, x, y in (('A: ', apply(state, ga), sa), ('B: ', apply(state, gb), sb)):
        leaves += budgets.compare_steps(prefix, x, y, state, budget, seen['update'],
                                        limits if prefix == 'B: ' else None)  # fmt: skip
    if grads:  # and the two sides' steps, each leaf to the budget of its step
        leaves += budgets.compare_steps('A vs B: ', sa, sb, state, budget, seen['update'])
    report.limits = {**(report.limits or {}), 'update': limits}
    report.compared['update'] = (3 if grads else 2) * len(jax.tree.leaves(sa))
    if leaves:
        return 'update', None, leaves
    return None, None, sa
