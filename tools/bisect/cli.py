"""Where do two twins first disagree? `python -m tools.bisect`: the step, the phase, the
layer, the leaves, and what a constant ratio between them points to.

    python -m tools.bisect --model=mlp --twins=auto,explicit --steps=5
    python -m tools.bisect --twins=explicit,mypkg.my_dp --strategy=dp --x64
    python -m tools.bisect --twins=one_device,explicit --strategy=tp --mesh=4x2
    python -m tools.bisect --twins=one_device,typed --mesh=data:2,fsdp:2,model:2
    python -m tools.bisect --twins=auto,explicit --from=runs/a@1000   # from a checkpoint
    python -m tools.bisect RUN_A RUN_B      # two train runs' workdirs, on any two meshes
    python -m tools.bisect RUN_TPU RUN_CPU  # a run from another machine: its steps as saved

Each of --twins is a twin (auto, explicit, typed: its STRATEGIES[--strategy]; a named --mesh
runs the file that covers its axes, else composed.py, as the train CLI), one_device, or the
import path of a strategy module with loss_and_grads, train_step and eval_step (a copy of
explicit/dp.py with one line changed, on PYTHONPATH). Both start from one initial state (the
seed's, or --from's checkpoint: trained.py) and take the same batches; sides.py loads them,
divergence.py and stepping.py compare them. Exit 0: they agree for --steps steps; 1: they
diverge (the report says where; two runs that differ with no checkpoint to replay them from: one
line), or the data is missing or unreadable (the train CLI's line); 2: bad input (the train
CLI's own checks, --from's, one line); 3: a side cannot run (`B (mypkg.my_dp) fails to trace at
mypkg/my_dp.py:42: ...`).
docs/bisect.md walks through it.
"""

import dataclasses
import json
import sys
import traceback

from absl import flags, logging

from shard_parity import UsageError, exit_status, refuse
from shard_parity.datasets.root import DataError
from shard_parity.runtime import flags as F
from shard_parity.runtime import plain_warnings

from . import trained
from .report import as_dict, render

TWINS = flags.DEFINE_list(
    'twins',
    ['auto', 'explicit'],
    'A,B: twins (auto, explicit, typed), one_device, or import paths of strategy modules.',
)
TOLERANCE = flags.DEFINE_enum(
    'tolerance',
    None,
    ['f32', 'bitwise', 'model'],
    'f32: round-off (rtol 1e-5, atol 1e-6 of each leaf\'s largest value); bitwise: exact; '
    'model: each leaf\'s norm-wise error against its budget in the error model of '
    'docs/numerics.md, from both sides\' precision. Default: model where either side computes '
    'or reduces in less than float32 (--dtype, --reduce_dtype), else f32.',
)
X64 = flags.DEFINE_bool(
    'x64',
    False,
    'Both sides in float64 throughout (model, LayerNorm, GELU, softmax, optimizer): correct '
    'twins agree to ~1e-12, so a bug stands out by ten orders of magnitude.',
)
JSON = flags.DEFINE_bool('json', False, 'Print the report as one JSON object.')
FROM = flags.DEFINE_string(
    'from',
    None,
    'WORKDIR[@STEP]: start from a train run\'s checkpoint (its newest, or step STEP), with its '
    'model, training settings and (unless --dtype, --reduce_dtype say) precision, on the '
    'batches the run takes next, on the flags\' mesh. With two run directories: RUN@STEP, the '
    'checkpoint both hold to replay from.',
)
SHADOW = flags.DEFINE_enum(
    'shadow',
    None,
    ['float32'],
    'float32: run the same comparison a second time with both sides computing and reducing in '
    'float32, and report both verdicts (exit 1 if either diverges): bf16\'s round-off hides a '
    'change below its detection limit, which the report states; float32\'s is far smaller.',
)
RECORDED = flags.DEFINE_enum(
    'recorded',
    None,
    ['A', 'B'],
    'With two run directories: that run\'s steps are read from its checkpoints s and s+1, not '
    'replayed here, and the other runs step s live from its state s (tools/bisect/recorded.py). '
    'Default: a run whose config.json says it trained on another platform than this host.',
)
PARTIAL = flags.DEFINE_integer(
    'partial_window', 0,
    'P: the last step compared is a partial window, P of --gradient_accumulation_steps\' K '
    'microbatches holding rows and the rest weighing zero (1 to K-1), as an epoch ends where its '
    'examples do not divide into K (datasets/batches.py, partial_window); 0: none.', lower_bound=0,
)  # fmt: skip
DEFAULT_STEPS = 20


def main(argv):
    if not flags.FLAGS['verbosity'].present:  # Orbax and XLA log a lot at INFO
        logging.set_verbosity(logging.WARNING)
    if not F.VERBOSE.value:  # `warning: ...` (a checkpoint read unverified), not absl's format
        plain_warnings()
    try:
        import jax

        from shard_parity.devices import configure_jax

        configure_jax(F.CPU_DEVICES.value, cpu_fma=F.CPU_FMA.value, libtpu_lines=F.VERBOSE.value)
        jax.config.update('jax_enable_x64', X64.value)  # before any array is made
        if len(argv) not in (1, 3):
            raise UsageError(f'expected two run directories or none, got {argv[1:]}')
        if PARTIAL.value and len(argv) == 3:
            raise UsageError(f'--partial_window={PARTIAL.value} replays a window from the flags, '
                             'not two run directories: drop it')  # fmt: skip
        if RECORDED.value and len(argv) != 3:
            raise UsageError(
                f'--recorded={RECORDED.value} names which of two run directories is read from '
                'its checkpoints: give RUN_A RUN_B'
            )
        report = from_runs(*argv[1:]) if len(argv) == 3 else from_flags()
        shadow = shadowed() if SHADOW.value and len(argv) == 1 else None
    except (UsageError, DataError, OSError) as e:
        if F.VERBOSE.value:
            traceback.print_exc()
        # 2: a bad input; 1: the data (the train CLI's line and status), or runs that differ
        # where no checkpoint lets them be replayed (runs.Unreplayable)
        refuse(str(e), exit_status(e))
    except Exception as e:  # sides.SideFailed: one side cannot run, which is no divergence
        if type(e).__name__ != 'SideFailed':
            raise
        if F.VERBOSE.value:
            traceback.print_exc()
        refuse(str(e), 3)
    if shadow is not None:  # both verdicts: the flags' precision, then float32's
        out = {'report': as_dict(report), 'float32': as_dict(shadow)}
        print(json.dumps(out) if JSON.value else f'{render(report)}\n\n--shadow=float32, the '
              f'same comparison with both sides in float32:\n{render(shadow)}')  # fmt: skip
        sys.exit(1 if report.diverged or shadow.diverged else 0)
    print(json.dumps(as_dict(report)) if JSON.value else render(report))
    sys.exit(1 if report.diverged else 0)


def shadowed():
    """The flags' comparison again with --dtype and --reduce_dtype float32 (--shadow)."""
    dtypes = {n: flags.FLAGS[n].value for n in ('dtype', 'reduce_dtype')}
    try:
        for n in dtypes:
            flags.FLAGS[n].value = 'float32'
            flags.FLAGS[n].present = 1  # --from keeps it: the run's policy is not wanted here
        return from_flags()
    finally:
        for n, v in dtypes.items():
            flags.FLAGS[n].value = v


def tolerance() -> str | None:
    """The flags' tolerance; None: the sides' default (divergence.default_tolerance)."""
    return 'x64' if X64.value else TOLERANCE.value


def from_flags():
    from shard_parity.step import NarrowReduce

    from . import divergence as D
    from .sides import load_side

    if len(TWINS.value) != 2:
        raise UsageError(f'--twins={",".join(TWINS.value)}: give two, such as auto,explicit')
    begin = trained.read(FROM.value) if FROM.value else None  # its model becomes the flags'
    start = started(begin and begin.saved)
    state = widen(trained.state(begin, start.state)) if begin else start.state
    try:
        a, b = (load_side(name, start.plan, start.mesh) for name in TWINS.value)
    except NarrowReduce as e:  # the train CLI's fix is no fix here: which twins to bisect
        twins = [n if reduces_narrow(n) else 'explicit' for n in TWINS.value]
        twins[0] = 'one_device' if twins[0] == twins[1] else twins[0]
        raise UsageError(
            f'--twins={",".join(TWINS.value)}: {e.reason}; bisect --twins={",".join(twins)} '
            '(explicit casts beside each collective), or drop --reduce_dtype'
        ) from e
    steps = F.TRAIN['steps'].value or DEFAULT_STEPS
    if PARTIAL.value:  # the last step compared
        start.batches.partial = window(start, (begin.step if begin else 0) + steps - 1)
    report = D.bisect(
        a, b, start.graphdef, start.loss_fn, start.tx, state, start.batches, steps,
        tolerance(), start=begin.step if begin else 0,
    )  # fmt: skip
    report.notes[:0] = [trained.note(begin)] if begin else []
    return report


def reduces_narrow(name: str) -> bool:
    """Whether --twins' `name` can reduce in less than float32 (a twin whose REDUCES_NARROW is
    false cannot; a module of yours, or one_device, is taken at its word)."""
    import importlib

    from .sides import module_name

    try:
        package = importlib.import_module(module_name(name.split('.')[0]))
    except ImportError:
        return True
    return getattr(package, 'REDUCES_NARROW', True)


def started(saved: dict | None = None):
    """What both sides start from, by the flags: the plan (checked) and its mesh, the task's
    loss and batches, the optimizer, and the initial state. tools/fuzz/worker.py starts every
    draw here too, so that a fuzzer's draw and its bisect command are the same run. `saved`: a
    checkpoint's config (--from), whose model and training settings are used (trained.py)."""
    import types

    from flax import nnx
    from jax.sharding import AxisType

    from shard_parity import config as cfg
    from shard_parity.devices import use_matmul_precision
    from shard_parity.mesh import mesh_for
    from shard_parity.runtime import from_flags, tasks
    from shard_parity.step import create_state, make_optimizer

    model = F.MODEL.value
    # --steps is how many steps to compare; the schedule stays the model's (not decayed over N)
    changes = {n: f.value for n, f in F.TRAIN.items() if f.value is not None and n != 'steps'}
    config = dataclasses.replace(cfg.TRAIN_DEFAULTS[model], **changes)
    config = trained.train_config(saved) if saved else config
    # the train CLI's plan and checks (a default batch that does not split: fewer devices)
    plan = from_flags.plan(fit_default_batch=True)
    mesh = mesh_for(plan, AxisType.Auto)  # each side takes its twin's axis types (sides.py)
    use_matmul_precision(plan.precision.matmul)
    if X64.value:  # float64 throughout: the step's casts and collectives too
        plan = plan.in_float64()
    shape = from_flags.model_config()
    shape = trained.shape(saved, shape) if saved else shape
    if X64.value:  # float64 throughout: the compute and the gradients
        shape = dataclasses.replace(shape, dtype='float64', reduce_dtype='float64')
    if model == 'mlp':
        task = tasks.mnist_task(config, F.DATA_DIR.value, F.DOWNLOAD.value, shape)
    else:
        task = tasks.shakespeare_task(config, shape, F.DATA_DIR.value, F.DOWNLOAD.value)
    tx = make_optimizer(config)
    graphdef, state = create_state(task.make_model(nnx.Rngs(config.seed)), tx)
    return types.SimpleNamespace(
        plan=plan, mesh=mesh, graphdef=graphdef, loss_fn=task.loss_fn, tx=tx,
        state=widen(state), batches=Batches(task), task=task, config=config,
    )  # fmt: skip


def window(start, step: int, present: int | None = None) -> tuple[int, int]:
    """(step, P): `step` a partial window of P (--partial_window's, or `present`) of K
    microbatches; a P that is no partial window of K is refused in one line."""
    present = PARTIAL.value if present is None else present
    k = start.config.gradient_accumulation_steps
    if k < 2:
        raise UsageError(f'--partial_window={present}: a window of P of K microbatches needs '
                         f'--gradient_accumulation_steps of 2 or more (got {k})')  # fmt: skip
    if not 1 <= present < k:
        raise UsageError(f'--partial_window={present}: a partial window of K={k} microbatches '
                         f'holds 1 to K-1 ({k - 1}) of them')  # fmt: skip
    return step, present


class Batches:
    """The task's training batches, in float64 under --x64; `partial` (step, P): that step a
    partial window of P of K microbatches (--partial_window; tools.fuzz's draws)."""

    def __init__(self, task, partial: tuple[int, int] | None = None):
        self.task, self.partial = task, partial

    def batch(self, i):
        batch = self.task.train_batches.batch(i)
        if self.partial and i == self.partial[0]:
            from shard_parity.datasets.batches import partial_window

            batch = partial_window(batch, self.task.loss_fn.steps, self.partial[1])
        return widen(batch)


def widen(tree):
    """Under --x64, every float32 array of `tree` as float64, on the host."""
    import jax
    import numpy as np

    def cast(x):
        x = np.asarray(x)
        return x.astype(np.float64) if X64.value and x.dtype == np.float32 else x

    return jax.tree.map(cast, tree)


def from_runs(run_a: str, run_b: str):
    from . import runs

    steps = F.TRAIN['steps'].value
    return runs.bisect_runs(run_a, run_b, tolerance(), widen, steps, FROM.value, RECORDED.value)
