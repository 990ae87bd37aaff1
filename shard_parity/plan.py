"""The plan: everything that decides what a training step is, in one frozen object.

    --mesh=data:2,fsdp:2,model:2        a 3-D mesh: HSDP (data x fsdp) with tensor parallelism
    --strategy=fsdp_tp --mesh=4x2       the same as --mesh=fsdp:4,model:2: a strategy is a name
                                        for the mesh it runs on

A `Plan` is the mesh's named axes in order, the strategy file each twin runs on them, the
pipeline's --microbatches, --pp_schedule and --pp_virtual, the context ring's --cp_layout, the
precision policy, and --shard_optimizer_over_data (ZeRO-1: AdamW's moments split over 'data',
docs/zero1.md). It is built in two places only: from the flags
(shard_parity/runtime/from_flags.py, `plan`) and from a run's saved config.json
(`from_config`); `to_config` writes it there. Everything else is handed the plan whole: the
train loop, placement (shard_parity/placement.py), memory, the step's choice of file
(shard_parity/step.py, `strategy_file`), the bisector, the inspector, the benchmarks. What the
plan must satisfy (heads, layers, experts, the sequence, the rows divisible by the axes that
split them) is shard_parity/checks.py, the one place that refuses a plan.

What each axis does, written once (docs/composition.md walks a step):

    data    the batch's rows split; the state whole; the gradients averaged (dp)
    fsdp    the rows split and the state too: each layer gathered where it runs, its gradient
            reduce-scattered (ZeRO-3); data x fsdp is HSDP
    model   tensor parallelism: heads and feed-forward units split (Megatron)
    seq     context parallelism: each sequence's positions split, attention round a ring
    stage   pipeline parallelism: the stacked layers split into stages, microbatches
    expert  expert parallelism: a mixture of experts' experts split, tokens exchanged

The strategy file is a single-strategy file where one covers the named axes
(`--mesh=data:4,model:2` runs <twin>/tp.py), else <twin>/composed.py. An axis a strategy does
not use holds copies (`--strategy=dp --mesh=4x2`: each 'model' group's two devices compute the
same thing). This module and checks.py are the only places that switch on a strategy's name.
"""

import dataclasses
import math

from shard_parity import UsageError

DATA, FSDP, MODEL, SEQ, STAGE, EXPERT = 'data', 'fsdp', 'model', 'seq', 'stage', 'expert'
AXES = (DATA, FSDP, STAGE, EXPERT, SEQ, MODEL)  # every axis a mesh may name
ROWS = (DATA, FSDP, EXPERT)  # the axes that split the batch's rows (each its own rows)
BATCH_AXES = (*ROWS, SEQ)  # ...and the positions: every axis over which the loss is a mean
DOES = {
    DATA: 'the batch split, the state whole, the gradients averaged (dp)',
    FSDP: 'the batch and the state split, each layer gathered where it runs (ZeRO-3)',
    MODEL: 'tensor parallelism: heads and feed-forward units split (Megatron)',
    SEQ: 'context parallelism: each sequence split, attention round a ring',
    STAGE: 'pipeline parallelism: the layers split into stages (--microbatches)',
    EXPERT: 'expert parallelism: the experts split, tokens exchanged all-to-all',
}

# Each strategy file's axes (a name for a mesh), and the names of --mesh=AxB's two numbers.
STRATEGY_AXES = {
    'dp': (DATA,),
    'fsdp': (FSDP,),
    'tp': (DATA, MODEL),
    'fsdp_tp': (FSDP, MODEL),
    'cp': (DATA, SEQ),
    'pp': (DATA, STAGE),
    'ep': (DATA, EXPERT),
    'composed': AXES,
}
STRATEGIES = tuple(STRATEGY_AXES)  # each twin has one file per name: <twin>/<name>.py
TWO_AXES = {s: (axes + (MODEL,))[:2] for s, axes in STRATEGY_AXES.items() if s != 'composed'}
MOE_STRATEGIES = ('dp', 'ep', 'composed')  # where a mixture of experts' parity is tested
SCHEDULES = ('gpipe', '1f1b', 'interleaved')  # --pp_schedule
LAYOUTS = ('zigzag', 'contiguous')  # --cp_layout
MICROBATCHES = 4  # --microbatches' default: M


@dataclasses.dataclass(frozen=True)
class Precision:
    """The mixed-precision policy, in the names FSDP2 and jmp use (docs/numerics.md): master
    parameters and AdamW's state in `param`; the model's arithmetic in `compute` (--dtype,
    Flax's `dtype`); what the gradients' collectives carry in `reduce`; the dots' precision in
    `matmul` (DEFAULT: on a TPU one bf16 pass for float32 operands)."""

    param: str = 'float32'
    compute: str = 'float32'
    reduce: str = 'float32'
    matmul: str = 'default'

    def text(self) -> str:
        """jmp's spelling: 'params=float32,compute=bfloat16,reduce=float32,matmul=default'."""
        return ','.join(f'{k}{"s" if k == "param" else ""}={v}'
                        for k, v in dataclasses.asdict(self).items())  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a step is: the mesh's axes in order, (('data', 2), ('fsdp', 2), ('model', 2)), the
    strategy file that runs on them, the options its axes take, and the precision. Hashable:
    equal plans compile the same program (after `canonical`, which drops unused options).
    `spelled`: how the user named the mesh, for messages only (not compared)."""

    axes: tuple[tuple[str, int], ...]
    strategy: str = 'composed'
    microbatches: int = MICROBATCHES  # with a 'stage' axis: M microbatches per row device
    schedule: str = 'gpipe'  # --pp_schedule
    virtual: int | None = None  # --pp_virtual as given; `chunks` is V
    layout: str = 'zigzag'  # --cp_layout, with a 'seq' axis
    precision: Precision = Precision()
    zero1: bool = False  # --shard_optimizer_over_data: AdamW's moments split over 'data' (ZeRO-1)
    spelled: str = dataclasses.field(default='', compare=False)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.axes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(n for _, n in self.axes)

    @property
    def devices(self) -> int:
        return math.prod(self.shape)

    def uses(self, axis: str) -> bool:
        """Whether `axis` is on the mesh and does its job there (size 1 included)."""
        return axis in self.names and axis in STRATEGY_AXES[self.strategy]

    def size(self, axis: str) -> int:
        """How many ways `axis` splits what it splits: 1 when absent or idle."""
        return dict(self.axes)[axis] if self.uses(axis) else 1

    @property
    def idle(self) -> tuple[str, ...]:
        return tuple(a for a in self.names if not self.uses(a))

    @property
    def rows(self) -> tuple[str, ...]:
        """The axes that split the batch's rows, in mesh order (a PartitionSpec entry)."""
        return tuple(a for a in self.names if a in ROWS and self.uses(a))

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """Every axis over which the loss is a mean of equal parts: rows and positions."""
        return tuple(a for a in self.names if a in BATCH_AXES and self.uses(a))

    @property
    def chunks(self) -> int:
        """V, the chunks each stage runs: --pp_virtual (default 2) under interleaved, else 1."""
        if self.schedule != 'interleaved':
            return 1
        return 2 if self.virtual is None else self.virtual

    def text(self) -> str:
        return ','.join(f'{a}:{n}' for a, n in self.axes)

    def given(self) -> str:
        """The mesh as the user gave it (--mesh=..., --strategy=...), for messages."""
        return self.spelled or f'--mesh={self.text()}'

    def in_float64(self) -> 'Plan':
        """The same step in float64 throughout (the bisector's --x64, the tests' float64 runs):
        master parameters, compute and every collective."""
        wide = Precision('float64', 'float64', 'float64', self.precision.matmul)
        return dataclasses.replace(self, precision=wide)

    def canonical(self) -> 'Plan':
        """The same step with the options its axes do not take at their defaults: two plans
        that compile the same program are equal (the key a compile cache wants)."""
        stage, seq = self.uses(STAGE), self.uses(SEQ)
        return dataclasses.replace(
            self,
            microbatches=self.microbatches if stage else MICROBATCHES,
            schedule=self.schedule if stage else 'gpipe',
            virtual=self.chunks if stage and self.schedule == 'interleaved' else None,
            layout=self.layout if seq else 'zigzag',
        )

    def to_config(self) -> dict:
        """config.json's keys for the plan (`from_config` reads them back): the options only
        where the axes take them, as runs saved before the plan was one object have them."""
        return {
            'strategy': self.strategy,
            'devices': self.devices,
            'mesh': dict(self.axes),
            **({'cp_layout': self.layout} if self.uses(SEQ) else {}),
            **({'microbatches': self.microbatches} if self.uses(STAGE) else {}),
            # gpipe's runs record no schedule, as before there was a choice
            **({'pp_schedule': self.schedule, 'pp_virtual': self.chunks}
               if self.uses(STAGE) and self.schedule != 'gpipe' else {}),
            # the compute and reduce dtypes are the model's own (model_config's), the rest here
            **({'precision': {'matmul': self.precision.matmul}}
               if self.precision.matmul != 'default' else {}),
            **({'shard_optimizer_over_data': True} if self.zero1 else {}),
        }  # fmt: skip


def from_config(saved: dict) -> Plan:
    """A run's config.json -> its plan. Runs saved before named meshes called fsdp's axis
    'data' ({'data': 4, 'model': 2} under fsdp is fsdp:4,model:2); runs saved before an option
    existed take its default."""
    strategy, mesh = saved.get('strategy'), saved.get('mesh')
    if strategy not in STRATEGY_AXES or not isinstance(mesh, dict) or not all(
        a in AXES and isinstance(n, int) and n > 0 for a, n in mesh.items()
    ):
        raise UsageError(
            f'a config.json with strategy {strategy!r} and mesh {mesh!r}: expected one of '
            f'{", ".join(STRATEGIES)} and a mesh of named axes ({", ".join(AXES)}) and sizes'
        )
    axes = tuple(mesh.items())
    if strategy in ('fsdp', 'fsdp_tp') and FSDP not in mesh and DATA in mesh:
        axes = tuple((FSDP if a == DATA else a, n) for a, n in axes)
    model = saved.get('model_config') or {}
    dtypes = {k: model.get(f, 'float32') for k, f in (('compute', 'dtype'), ('reduce', 'reduce_dtype'))}
    plan = Plan(
        axes,
        strategy,
        microbatches=saved.get('microbatches', MICROBATCHES),
        schedule=saved.get('pp_schedule', 'gpipe'),
        virtual=saved.get('pp_virtual'),
        layout=saved.get('cp_layout', 'zigzag'),
        precision=Precision(**dtypes, **saved.get('precision', {})),
        zero1=bool(saved.get('shard_optimizer_over_data', False)),
    )
    return plan.canonical()


def strategy_for(names) -> str:
    """The single-strategy file that covers these axes, else 'composed'."""
    for strategy, axes in STRATEGY_AXES.items():
        if set(names) <= set(axes):
            return strategy
    return 'composed'


def parse(text: str | None, strategy: str | None, devices: int, experts: bool = False,
          **options) -> Plan:  # fmt: skip
    """--mesh (and --strategy) -> a Plan over `devices` devices, with `options` (microbatches,
    schedule, virtual, layout, precision, zero1: the Plan's fields) as given; ZeRO-1 (zero1)
    runs the composed step on the mesh's axes.

    'data:2,fsdp:2,model:2': named axes; the strategy file is the one that covers them (with
    `experts`, one that runs a mixture of experts: dp, ep, else the composed step), or
    --strategy=composed to run the composed step on them anyway. 'AxB' (or 'N': N devices on
    the first axis; or none: every device there): --strategy's two axes, as before named meshes.
    """
    if text and ':' in text:
        plan = named(text, devices)
        plan = dataclasses.replace(plan, spelled=f'--mesh={text}', **options)
        if strategy not in (None, 'composed', plan.strategy):
            raise UsageError(
                f'--strategy={strategy} with --mesh={text}: a named mesh says what runs '
                f'(here {plan.strategy}); drop --strategy, or give --strategy=composed'
            )
        if (experts and plan.strategy not in MOE_STRATEGIES) or plan.zero1:  # ZeRO-1: composed
            plan = dataclasses.replace(plan, strategy='composed')
        if (strategy or plan.strategy) == 'composed':
            return dataclasses.replace(plan, strategy='composed')
        # a strategy file names its axes: those the mesh leaves out are there, of size 1
        missing = tuple((a, 1) for a in STRATEGY_AXES[plan.strategy] if a not in plan.names)
        return dataclasses.replace(plan, axes=missing + plan.axes)
    flags = (strategy and f'--strategy={strategy}', text and f'--mesh={text}')
    typed = ' '.join(f for f in flags if f)
    strategy = strategy or 'dp'
    if strategy == 'composed':
        raise UsageError(
            '--strategy=composed runs the named axes of a --mesh such as '
            f'--mesh=data:2,fsdp:2,model:2 (their sizes multiplying to the {devices} devices), '
            + (f'not --mesh={text}' if text else 'and no --mesh was given')
        )
    shape = two_numbers(text) if text else (devices, 1)
    plan = Plan(tuple(zip(TWO_AXES[strategy], shape)), strategy, **options)
    if plan.zero1 and DATA in plan.names:  # ZeRO-1 runs the composed step on these axes
        plan = dataclasses.replace(plan, strategy='composed')
    # messages name the flags the user typed, else the default mesh (no --strategy=dp unasked)
    default = 'one device' if devices == 1 else f'{plan.text()}, the default mesh'
    return dataclasses.replace(plan, spelled=typed or default)


SYNTAX = (
    'name:size pairs separated by commas, such as --mesh=data:2,fsdp:2,model:2, each axis '
    f'once, in any order (the axes: {", ".join(AXES)})'
)


def named(text: str, devices: int) -> Plan:
    """'data:2,fsdp:2,model:2' -> a Plan of those axes, in that order (the mesh's device
    layout: the first axis varies slowest). Names are case-insensitive and spaces around them
    are dropped; each axis at most once."""
    axes = []
    for part in text.split(','):
        name, colon, size = (p.strip() for p in part.partition(':'))
        name = name.lower()
        if not colon or not size.isascii() or not size.isdigit():
            raise UsageError(f'--mesh={text}: {part.strip()!r} is not name:size; expected {SYNTAX}')
        if name not in AXES:
            raise UsageError(
                f'--mesh={text}: unknown axis {name!r}; the axes are {", ".join(AXES)} '
                '(each name:size, e.g. --mesh=data:2,fsdp:2,model:2)'
            )
        if name in dict(axes):
            raise UsageError(
                f'--mesh={text}: the axis {name!r} is given twice; name each axis once, with the '
                'size it splits by (e.g. --mesh=data:2,fsdp:2,model:2)'
            )
        if int(size) < 1:
            raise UsageError(f'--mesh={text}: the size of {name!r} must be a positive integer')
        axes.append((name, int(size)))
    plan = Plan(tuple(axes), strategy_for(dict(axes)))
    if plan.devices != devices:
        fewer = f' (or --num_devices={plan.devices}: the first {plan.devices})'
        raise UsageError(
            f'--mesh={text} has {plan.devices} devices ({" x ".join(map(str, plan.shape))}), '
            f'but {devices} are in use: the sizes must multiply to {devices}'
            + (fewer if plan.devices < devices else '')
        )
    return plan


def two_numbers(text: str) -> tuple[int, int]:
    """'4x2' -> (4, 2); '8' -> (8, 1): that many devices on the strategy's first axis."""
    parts = text.lower().split('x')
    numbers = all(p.isascii() and p.isdigit() and int(p) > 0 for p in parts)
    if len(parts) not in (1, 2) or not numbers:
        raise UsageError(
            f'--mesh={text}: expected DATAxMODEL, two positive integers such as 4x2 (or one, 8: '
            f'8x1), or named axes: {SYNTAX}'
        )
    return int(parts[0]), int(parts[1]) if len(parts) == 2 else 1
