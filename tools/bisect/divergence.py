"""The bisector's core: two sides (twins, strategy modules or the one-device run), stepped from
the same state on the same batches, compared phase by phase until the first divergence.

Each step starts both sides from the same state (side A's result of the step before), so every
comparison measures what one step does, not the drift of many: within round-off, any difference
at step k was made at step k. Per step, in order:

    forward    each module's output, in the order the modules finish, then the loss metrics
    gradients  every leaf of loss_and_grads' gradient
    update     every leaf of the state train_step returns (step, params, optimizer state)

The activations come from the side's own eval_step (its own placement and shard_map), running
the loss under intercepted module calls (tools/bisect/intercept.py: which outputs are kept and
why); one step's comparison, phase by phase, is tools/bisect/stepping.py's compare_step.

Under --tolerance=model (the default where either side computes or reduces in less than
float32) each leaf is held to its budget in shard_parity/numerics.py's error model, norm-wise:
the k-th module output to forward(k), each loss metric to loss(its measured sensitivity), each
gradient leaf to gradients(), the state after the update to update() (a moment to moment(), a
parameter to parameters()); the report keeps each phase's largest error / budget.

The sides themselves (a twin, a module of yours, one device; placed on their meshes) are
tools/bisect/sides.py's; how two leaves differ and what that points to, tools/bisect/leaves.py's.
"""

import dataclasses

import jax
import numpy as np

from shard_parity import numerics
from shard_parity.step import apply_gradients

from .leaves import compare_trees, hints
from .sides import Side, SideFailed, load_side  # noqa: F401 (its API: load, bisect)
from .stepping import Runner, compare_step, spread_over


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
    identical: bool = False  # two run directories whose every shared figure is the same number
    # phase -> {leaf: its detection limit}, at the last step compared: the smallest relative
    # change of that leaf the comparison would have caught (its budget; tools/bisect/budgets.py)
    limits: dict | None = None
    first: int = 0  # the first step compared (--from's checkpoint step)

    @property
    def diverged(self) -> bool:
        return self.step is not None



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
    tolerance, report.first = report.tolerance, start
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
        devices = spread_over(a, b, 'batch_axes')
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
