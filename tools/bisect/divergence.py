"""The bisector's core: two sides (twins, strategy modules or the one-device run), stepped from
the same state on the same batches, compared phase by phase until the first divergence.

Each step starts both sides from the same state (side A's result of the step before), so every
comparison measures what one step does, not the drift of many: within round-off, any difference
at step k was made at step k. Per step, in order:

    forward    each module's output, in the order the modules finish, then the loss metrics
    gradients  every leaf of loss_and_grads' gradient
    update     every leaf of the state train_step returns (step, params, optimizer state)

The activations come from the side's own eval_step (its own placement and shard_map), running
the loss under intercepted module calls. Only per-example outputs (leading dimension the batch)
that are whole on every device are kept: under explicit tensor parallelism a column-parallel
layer's output is one device's columns and a row-parallel one's a partial sum, which have no
counterpart on the other side; under context parallelism ('seq') an output holds one device's
positions only, and is left out the same way (and where 'seq' splits positions, compare_step
compares no output at all: a side holds them in its own layout). flax's
nnx.capture(method_outputs=) records outputs too, but sorted by name; here the order they were
computed in names the first layer that differs.

Under --tolerance=model (the default where either side computes or reduces in less than
float32) each leaf is held to its budget in shard_parity/numerics.py's error model, norm-wise:
the k-th module output to forward(k), each loss metric to loss(its measured sensitivity), each
gradient leaf to gradients(), the state after the update to update() (a moment to moment(), a
parameter to parameters()); the report keeps each phase's largest error / budget.

The sides themselves (a twin, a module of yours, one device; placed on their meshes) are
tools/bisect/sides.py's; how two leaves differ and what that points to, tools/bisect/leaves.py's.
"""

import contextlib
import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from shard_parity import numerics
from shard_parity.mesh import MODEL, SEQ
from shard_parity.model import ops
from shard_parity.model.ops import varying
from shard_parity.step import apply_gradients, bind

from .leaves import compare, compare_trees, hints, named_leaves
from .sides import Side, SideFailed, guarded, load_side, place  # noqa: F401 (its API: load, bisect)


# --- activations, recorded by intercepting every module's __call__ ---


@contextlib.contextmanager
def layers_named(root, paths: dict):
    """The transformer's blocks are stacked: its blocks are built from slices when they run
    (Transformer.layers). While this is open, the modules of each block built are named
    blocks.i.* in `paths`, as when the blocks were a list."""
    layers = getattr(type(root), 'layers', None)
    if layers is None:  # the MLP
        yield
        return

    def named_layers(self):
        blocks = layers(self)
        for i, block in enumerate(blocks):
            paths.update(
                {id(m): '.'.join(map(str, ('blocks', i, *p))) for p, m in nnx.iter_modules(block)}
            )
        return blocks

    type(root).layers = named_layers
    try:
        yield
    finally:
        type(root).layers = layers


ROUTER = '#router'  # a mixture of experts' routing margins, recorded beside its output


@contextlib.contextmanager
def intercepted(model, rows: int, on_output):
    """While open, every per-example output of `model`'s modules (`rows` rows, this device's
    batch; not split over 'model' or 'seq') goes through on_output(path, module, x, input), in
    the order they finish, and what it returns replaces x (a tuple's first element)."""
    root = model.func if isinstance(model, functools.partial) else model
    paths = {id(m): '.'.join(map(str, p)) or 'model' for p, m in nnx.iter_modules(root)}
    originals = {}

    def wrap(cls):
        original = originals[cls] = cls.__call__

        def call(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            x = out[0] if isinstance(out, tuple) else out
            per_example = args and getattr(args[0], 'ndim', 0) >= 2 and args[0].shape[0] == rows
            if id(self) in paths and per_example and not {MODEL, SEQ} & set(varying(x)):
                x = on_output(paths[id(self)], self, x, args[0])
                return (x, *out[1:]) if isinstance(out, tuple) else x
            return out

        cls.__call__ = call

    for cls in {type(m) for _, m in nnx.iter_modules(root)}:
        wrap(cls)
    try:
        with layers_named(root, paths):
            yield
    finally:
        for cls, original in originals.items():
            cls.__call__ = original


def recorded(loss_fn, names: list, kinds: dict | None = None):
    """An eval_fn(model, batch) for eval_step: runs `loss_fn` and returns the per-example outputs
    of every module, in the order they finished; their paths go into `names` while tracing.
    After them, each mixture of experts' routing margins, named path + ROUTER (`margins`)."""

    def capture(model, batch):
        outputs, classes, routers = [], {}, []

        def record(path, module, x, first):
            outputs.append((path, x))
            classes[path] = type(module).__name__
            if type(module).__name__ == 'MoE' and ops.typed(first) is None:
                routers.append((path + ROUTER, margins(module, first)))
            return x

        with intercepted(model, next(iter(batch.values())).shape[0], record):
            loss_fn(model, batch)
        names[:] = [n for n, _ in outputs + routers]
        if kinds is not None:  # each output's module class: a 'MoE' may flip tokens
            kinds.update(classes)
        return tuple(x for _, x in outputs + routers)

    return capture


def sensitivities(graphdef, loss_fn):
    """fn(params, batch) -> {metric: s}, on one device: how far a loss metric m moves when every
    module's output carries independent relative rounding, per unit of it,

        s = sqrt(sum over outputs k of ||dm / d eps_k||^2),   output_k x (1 + eps_k), eps_k = 0,

    the first-order propagation of each output's rounding to the metric, measured on this
    batch and these weights (numerics.Budget.loss takes s / |m|: a mean of T terms averages it
    as sqrt(T), a cross-entropy damps it by the logits' size against the loss, and both are in
    s). One forward and one backward per metric."""

    def metrics(eps, params, batch):
        model, it = nnx.merge(graphdef, params), iter(eps)

        def scale(path, module, x, first):
            return x * (1 + next(it)).astype(x.dtype)  # a bf16 output stays bf16

        with intercepted(model, next(iter(batch.values())).shape[0], scale):
            return loss_fn(model, batch)[1]

    @jax.jit
    def fn(params, batch):
        names = []
        shapes = jax.eval_shape(bind(graphdef, recorded(loss_fn, names)), params, batch)
        eps = [jnp.zeros(x.shape, jnp.float32) for n, x in zip(names, shapes)
               if not n.endswith(ROUTER)]  # fmt: skip
        values, pull = jax.vjp(lambda e: metrics(e, params, batch), eps)
        out = {}
        for k in values:  # one backward per metric, the others' cotangents zero
            cotangent = {j: jnp.asarray(j == k, v.dtype) for j, v in values.items()}
            grads = pull(cotangent)[0]
            out[k] = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in grads))
        return out

    return lambda params, batch: {k: float(v) for k, v in fn(params, batch).items()}


def margins(moe, x):
    """f32[B, T, 2]: each token's router margin at its top-k boundary (the k-th logit less
    the next), and the scale of what a relative rounding of its input moves that margin by
    (||logits|| sqrt(2 / E): two logits' share of the norm); route's logits, in float32 as route
    computes them. A token whose margin is within rounding may flip."""
    k = moe.cfg.experts_per_token
    logits = jnp.einsum('btd,de->bte', x.astype(jnp.float32), moe.router[...].astype(jnp.float32))
    if k >= logits.shape[-1]:  # every expert taken: nothing can flip
        return jnp.stack([jnp.full(logits.shape[:2], jnp.inf), jnp.zeros(logits.shape[:2])], -1)
    top = jax.lax.top_k(logits, k + 1)[0]  # the margin's noise: 2 logits', each ||l|| / sqrt(E)
    noise = jnp.linalg.norm(logits, axis=-1) * math.sqrt(2 / logits.shape[-1])
    return jnp.stack([top[..., k - 1] - top[..., k], noise], -1)


# --- the step-by-step run ---


@dataclasses.dataclass
class Report:
    twins: tuple[str, str]
    tolerance: str
    steps: int  # steps compared
    step: int | None = None  # the first step that diverged (None: none did)
    phase: str | None = None  # 'state', 'forward', 'gradients' or 'update'
    layer: str | None = None  # the first module whose output differs (forward only)
    leaves: list = dataclasses.field(default_factory=list)
    ratio: float | None = None
    hints: list = dataclasses.field(default_factory=list)
    compared: dict = dataclasses.field(default_factory=dict)  # phase -> leaves compared per step
    notes: list = dataclasses.field(default_factory=list)  # run directories: what was paired
    model: numerics.Budget | None = None  # --tolerance=model: the two sides' error model
    worst: dict = dataclasses.field(default_factory=dict)  # phase -> [leaf, error / budget]
    seen: list = dataclasses.field(default_factory=list, repr=False)  # (phase, leaf, fraction)
    flips: list = dataclasses.field(default_factory=list)  # [step, MoE layer, tokens flipped]
    # [step, MoE layer, flips expected]: one side runs it where the forward cannot see it
    hidden_flips: list = dataclasses.field(default_factory=list)
    # [step, flips expected out of sight]: a forward output failed where flips may be the cause
    suspect: list | None = None

    @property
    def diverged(self) -> bool:
        return self.step is not None


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


def _split(a: Side, b: Side, axes: str) -> int:
    """The most devices either side's plan spreads over its `axes` ('rows': how many blocks of
    rows the batch is split into; 'batch_axes': the devices a gradient is reduced over, rows
    and positions)."""
    plans = [s.plan for s in (a, b) if s.mesh]
    return max((math.prod(p.size(x) for x in getattr(p, axes)) for p in plans), default=1)


class _Seen(list):
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


def compare_step(ra: Runner, rb: Runner, apply, state, batch, tolerance, report, step=None):
    """(phase, layer, differing leaves) of one step from `state`, or (None, None, A's state)."""
    n = _split(ra.side, rb.side, 'rows')
    common, acts_a, acts_b = [], [], {}
    # Under 'seq' a side's per-example outputs hold its positions in its layout (zigzag's
    # chunks reordered), which have no counterpart in the other's: the loss and gradients speak
    if not any(s.mesh and s.plan.size(SEQ) > 1 for s in (ra.side, rb.side)):
        acts_a, acts_b = ra.activations(state, batch), dict(rb.activations(state, batch))
        common = [(p, x) for p, x in acts_a if p in acts_b]
    report.compared['forward'] = len(common)
    terms = min(np.size(x) for x in jax.tree.leaves(batch))  # the loss's: rows x positions
    # the modules either side runs; under 'seq' (none compared) one device's forward, traced
    depth = max(len(acts_a), len(acts_b)) or ra.modules(state, batch)
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
    seen = {p: _Seen(report, p) for p in ('forward', 'loss', 'gradients', 'update')}
    flipped = set()  # tokens whose expert choice bf16 flipped: left out downstream
    for k, (path, x) in enumerate(common, 1):
        y = acts_b[path]
        if flipped:
            x, y = numerics.without(x, flipped), numerics.without(y, flipped)
        allowed = model and model.forward(k)
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
    # the larger of the two sides' |m| (a metric that is 0 on both is equal)
    sensitivity = model and ra.sensitivity(state, batch)

    def metric(a, b, path):
        size = max(abs(float(np.asarray(a))), abs(float(np.asarray(b))))
        if not sensitivity[path]:  # a count (the experts' dropped share): a term per flip
            return model.loss(0.0, size)
        return model.loss(sensitivity[path] / size if size else 0.0)

    leaves = compare_trees('', ma, mb, tolerance, model and metric, seen['loss'], model and ma)
    if leaves:
        return 'forward', None, leaves
    grads = model and model.gradients()
    leaves = compare_trees('', ga, gb, tolerance, grads, seen['gradients'])
    report.compared['gradients'] = len(leaves) or len(jax.tree.leaves(ga))
    if leaves:
        return 'gradients', None, leaves
    # AdamW divides by sqrt(v): gradients equal to round-off can give updates that differ far
    # more. So each side's train_step is held to what its own gradient makes of the state.
    leaves = []
    (sa, _), (sb, _) = ra.train_step(state, batch), rb.train_step(state, batch)
    update = model and state_budget(model, ga, gb, lambda g: apply(state, g).params)
    # the policy keeps the parameters and AdamW's state in float32 whatever --dtype says: a
    # leaf stored in another type is a bug even where its numbers are within round-off
    for prefix, x, y in (('A: ', apply(state, ga), sa), ('B: ', apply(state, gb), sb)):
        leaves += compare_trees(prefix, x, y, tolerance, update, seen['update'], state, True)
    if model:  # and the two sides' states, each leaf to the budget of its change this step
        leaves += compare_trees('A vs B: ', sa, sb, tolerance, update, seen['update'], state)
    report.compared['update'] = (3 if model else 2) * len(jax.tree.leaves(sa))
    if leaves:
        return 'update', None, leaves
    return None, None, sa


def state_budget(model: numerics.Budget, grads, other, update):
    """budget(before, after, path) of a leaf of the state after the step: AdamW's moments
    linear in the gradients' budget; a parameter by how far the optimizer's step moves it when
    its gradient carries the rounding the two sides measure (`grads` and `other`, the two
    sides'; `update` maps gradients to the parameters after the step from this state:
    numerics.spread, computed once, at the first parameter compared); else the square-root
    law."""
    paths = ['params.' + p for p, _ in named_leaves(grads)]
    moved = {}

    def budget(before, after, path):
        change = numerics.change(before, after)
        for tag, order in (('.mu.', 1), ('.nu.', 2)):
            if tag in f'.{path}.':
                return model.moment(change, order)
        if path in paths:
            if not moved:
                moved.update(zip(paths, numerics.spread(update, grads, other), strict=True))
            norm = float(np.linalg.norm(np.asarray(after, np.float64)))
            return model.parameters(moved[path] / norm if norm else 0.0)
        return model.update(change)

    return budget


def bisect(
    a: Side,
    b: Side,
    graphdef,
    loss_fn,
    tx,
    state,
    batches,
    steps,
    tolerance=None,
    start=0,
    state_b=None,
) -> Report:
    """Steps A and B side by side from `state` (B from `state_b` if given, e.g. its own
    checkpoint) on batches start..start+steps-1; stops at the first divergence. `tolerance`
    None: 'model' where either side's policy is not float32 throughout, else 'f32'."""
    report = new_report(a, b, tolerance)
    tolerance = report.tolerance
    if state_b is not None:
        model = report.model  # two runs' checkpoints: their trajectories' band at `start`
        allowed = model and max(model.update(), model.along(start))
        leaves = compare_trees('', state, state_b, tolerance, allowed)
        if leaves:
            return _diverged(report, start, 'state', None, leaves, a, b)
    ra, rb = Runner(a, graphdef, loss_fn, tx, 'A'), Runner(b, graphdef, loss_fn, tx, 'B')
    apply = shared_update(tx)
    for i in range(start, start + steps):
        batch = batches.batch(i)
        phase, layer, out = compare_step(ra, rb, apply, state, batch, tolerance, report, i)
        report.steps += 1
        if phase:
            return _diverged(report, i, phase, layer, out, a, b)
        state = out
    return report


def shared_update(tx):
    """apply(state, grads): the update the shared optimizer `tx` makes of `grads`, on one
    device (compare_step holds each side's train_step to it)."""
    one_device = jax.jit(lambda s, g: apply_gradients(s, g, tx))

    def apply(state, grads):
        return jax.device_get(one_device(jax.tree.map(np.asarray, state), grads))

    return apply


def new_report(a: Side, b: Side, tolerance: str | None = None) -> Report:
    """An empty report of A against B at `tolerance` (None: default_tolerance's), with the two
    sides' error model under 'model'. The bisector and the fuzzer's worker start here, so that
    a draw's verdict is its bisect command's."""
    tolerance = tolerance or default_tolerance(a, b)
    report = Report((a.name, b.name), tolerance, 0)
    if tolerance == 'model':
        devices = _split(a, b, 'batch_axes')
        report.model = numerics.Budget.of([a.plan.precision, b.plan.precision], devices)
    return report


def default_tolerance(a: Side, b: Side) -> str:
    """'model' where either side computes or reduces in less than float32, else 'f32'."""
    precisions = (a.plan.precision, b.plan.precision)
    policy = numerics.coarsest([(p.compute, p.reduce) for p in precisions])
    return 'model' if numerics.coarser(*policy) != 'float32' else 'f32'


def _diverged(report, step, phase, layer, leaves, a, b) -> Report:
    report.step, report.phase, report.layer, report.leaves = step, phase, layer, leaves
    report.ratio = leaves[0].ratio
    report.hints = hints(leaves[0], a, b)
    if leaves[0].blocks and report.suspect and report.suspect[0] == step:
        expected = report.suspect[1]
        report.hints.insert(0, (
            f'a few rows differ after mixture-of-experts layers hidden in a pipeline, where '
            f'{expected:.2g} tokens may take other experts within rounding: more tokens than '
            f'{numerics.plausible(expected)} flipped, or a bug in the routing'
        ) if expected else (
            'a few rows differ after tokens took other experts (the notes): a flip beyond the '
            'share the model allows, or a bug in the routing'
        ))  # fmt: skip
    return report
