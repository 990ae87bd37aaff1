"""The mesh as a plan: named axes, each doing one thing, composed.

    --mesh=data:2,fsdp:2,model:2        a 3-D mesh: HSDP (data x fsdp) with tensor parallelism
    --strategy=fsdp_tp --mesh=4x2       the same as --mesh=fsdp:4,model:2: a strategy is a name
                                        for the mesh it runs on

What each axis does, written once (the table below; docs/composition.md walks a step):

    data    the batch's rows split; the state whole; the gradients averaged (dp)
    fsdp    the rows split and the state too: each layer gathered where it runs, its gradient
            reduce-scattered (ZeRO-3); data x fsdp is HSDP
    model   tensor parallelism: heads and feed-forward units split (Megatron)
    seq     context parallelism: each sequence's positions split, attention round a ring
    stage   pipeline parallelism: the stacked layers split into stages, microbatches
    expert  expert parallelism: a mixture of experts' experts split, tokens exchanged

A `Plan` is the ordered axes and the file each twin runs: a single-strategy file where one
covers the named axes (`--mesh=data:4,model:2` runs <twin>/tp.py), else <twin>/composed.py.
An axis a strategy does not use holds copies (`--strategy=dp --mesh=4x2`: each 'model' group's
two devices compute the same thing, as they always did). Placement (shard_parity/placement.py),
the checks below and the inspector's expectations read the plan; nothing else switches on a
strategy's name.
"""

import dataclasses
import math

from absl import logging

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


@dataclasses.dataclass(frozen=True)
class Plan:
    """The mesh's axes in order, (('data', 2), ('fsdp', 2), ('model', 2)), and the strategy
    file that runs on them. An axis the strategy does not use is idle: it holds copies."""

    axes: tuple[tuple[str, int], ...]
    strategy: str = 'composed'

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

    def text(self) -> str:
        return ','.join(f'{a}:{n}' for a, n in self.axes)


def of(mesh, strategy: str = 'composed') -> Plan:
    """The plan of a built mesh, for `strategy`'s file (the twins know only their mesh)."""
    return Plan(tuple(mesh.shape.items()), strategy)


def strategy_for(names) -> str:
    """The single-strategy file that covers these axes, else 'composed'."""
    for strategy, axes in STRATEGY_AXES.items():
        if set(names) <= set(axes):
            return strategy
    return 'composed'


def parse(text: str | None, strategy: str | None, devices: int, experts: bool = False) -> Plan:
    """--mesh (and --strategy) -> a Plan over `devices` devices.

    'data:2,fsdp:2,model:2': named axes, in order; the strategy file is the one that covers
    them (with `experts`, one that runs a mixture of experts: dp, ep, else the composed step),
    or --strategy=composed to run the composed step on them anyway. 'AxB' (or none:
    every device on the first axis): --strategy's two axes, as before named meshes.
    """
    if text and ':' in text:
        plan = named(text, devices)
        if strategy not in (None, 'composed', plan.strategy):
            raise UsageError(
                f'--strategy={strategy} with --mesh={text}: a named mesh says what runs '
                f'(here {plan.strategy}); drop --strategy, or give --strategy=composed'
            )
        if experts and plan.strategy not in MOE_STRATEGIES:
            plan = dataclasses.replace(plan, strategy='composed')
        if (strategy or plan.strategy) == 'composed':
            return dataclasses.replace(plan, strategy='composed')
        # a strategy file names its axes: those the mesh leaves out are there, of size 1
        missing = tuple((a, 1) for a in STRATEGY_AXES[plan.strategy] if a not in plan.names)
        return dataclasses.replace(plan, axes=missing + plan.axes)
    strategy = strategy or 'dp'
    if strategy == 'composed':
        raise UsageError(
            f'--strategy=composed needs a named mesh such as --mesh=data:2,fsdp:2,model:2 '
            f'(its product the {devices} devices); got --mesh={text}'
        )
    shape = two_numbers(text) if text else (devices, 1)
    return Plan(tuple(zip(TWO_AXES[strategy], shape)), strategy)


def named(text: str, devices: int) -> Plan:
    axes = []
    for part in text.split(','):
        name, _, size = part.strip().partition(':')
        name = name.strip().lower()
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
        if not (size.strip().isascii() and size.strip().isdigit() and int(size) > 0):
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
    parts = text.lower().split('x')
    if len(parts) != 2 or not all(p.isascii() and p.isdigit() and int(p) > 0 for p in parts):
        raise UsageError(
            f'--mesh={text}: expected DATAxMODEL, two positive integers such as 4x2, or named '
            'axes such as data:2,fsdp:2,model:2'
        )
    return int(parts[0]), int(parts[1])


def from_saved(strategy: str, mesh: dict) -> Plan:
    """A run's config.json (its 'strategy' and 'mesh') -> its plan. Runs saved before named
    meshes called fsdp's axis 'data': {'data': 4, 'model': 2} under fsdp is fsdp:4,model:2."""
    axes = tuple(mesh.items())
    if strategy in ('fsdp', 'fsdp_tp') and FSDP not in mesh and DATA in mesh:
        axes = tuple((FSDP if a == DATA else a, n) for a, n in axes)
    return Plan(axes, strategy)


# --- The checks, one per axis: what each must divide. Each raises one line (docs/errors.md).

MOE_STRATEGIES = ('dp', 'ep', 'composed')  # where a mixture of experts' parity is tested


def check(plan: Plan, model_config, batch_size: int, microbatches: int = 1, layout='zigzag'):
    """Every used axis's check, then what the rows (and microbatches) must divide; warnings for
    axes that split nothing. Before anything compiles."""
    experts = getattr(model_config, 'num_experts', 0)
    if experts and plan.strategy not in MOE_STRATEGIES:
        named = ','.join(f'{a}:{n}' for a, n in plan.axes)
        raise UsageError(
            f'--strategy={plan.strategy} with --num_experts={experts}: the mixture of experts '
            f'runs under --strategy=dp or ep, or on a named mesh (--mesh={named}: the composed '
            'step); use one of those, or --num_experts=0'
        )
    for axis, check_axis in CHECKS.items():
        if plan.uses(axis):
            check_axis(plan, model_config, plan.size(axis), layout=layout, experts=experts)
    check_rows(plan, batch_size, microbatches if plan.uses(STAGE) else 1)
    for axis in plan.idle:
        if dict(plan.axes)[axis] > 1:
            logging.warning(
                "--strategy=%s splits nothing over '%s': the %d devices of each %s group hold "
                'the same shards and compute the same thing',
                plan.strategy, axis, dict(plan.axes)[axis], axis,
            )  # fmt: skip


def who(plan: Plan, axis: str) -> str:
    """How a message names what splits `axis`: the strategy, or the named mesh's axis."""
    return f"the mesh's {axis} axis" if plan.strategy == 'composed' else f'--strategy={plan.strategy}'


def divides(what: str, value: int, name: str, n: int, why: str, hint: str) -> None:
    if value % n:
        raise UsageError(
            f"{what}={value} is not divisible by the mesh's {name} ({n}): {why}; use a {hint}"
        )


def check_model(plan, config, m, **_):
    """Tensor parallelism splits heads and hidden features over 'model': they must divide."""
    if hasattr(config, 'num_heads'):
        sizes = {'--num_heads': config.num_heads, '--num_kv_heads': config.num_kv_heads}
    else:
        sizes = {'the hidden layer width': config.layer_sizes[1]}
    for name, size in sizes.items():
        divides(name, size, 'model axis', m, f'tensor parallelism gives each of the {m} '
                'devices of a model group an equal share', f'mesh whose model axis divides {size}')  # fmt: skip
    if m == 1 and plan.strategy in ('tp', 'fsdp_tp'):
        logging.warning(
            "--strategy=%s on a mesh whose 'model' axis is 1 splits nothing over it: it runs "
            "as %s; give 'model' more than 1 device (--mesh=4x2, or model:2) to split the layers",
            plan.strategy, 'fsdp' if plan.strategy == 'fsdp_tp' else 'dp',
        )  # fmt: skip


def check_seq(plan, config, n, layout='zigzag', experts=0, **_):
    """Context parallelism splits a transformer's sequence over 'seq' into equal chunks: n of
    them, or 2n in the zigzag layout (shard_parity/model/ring.py)."""
    if not hasattr(config, 'seq_len'):
        raise UsageError(
            f'{who(plan, SEQ)} splits sequences, and --model=mlp has none: use '
            '--model=transformer, or a mesh without a seq axis for the MLP'
        )
    if experts and n > 1:
        raise UsageError(
            f'--num_experts={experts} on a mesh whose seq axis is {n}: the experts\' capacity '
            'is per sequence, and a sequence split over devices would route differently; '
            'use a mesh without a seq axis with experts'
        )
    divides('--seq_len', config.seq_len, 'sequence axis', n, f'each of its devices holds '
            f'seq_len/{n} positions', f'multiple of {n}, or a mesh whose seq axis divides it')  # fmt: skip
    if layout == 'zigzag' and config.seq_len % (2 * n):
        raise UsageError(
            f'--seq_len={config.seq_len} is not divisible by 2 x the sequence axis '
            f'({2 * n}): the zigzag layout gives each of the {n} devices two chunks of '
            f'seq_len/{2 * n} positions; use a multiple of {2 * n}, or --cp_layout=contiguous'
        )
    if n == 1 and plan.strategy == 'cp':
        logging.warning(
            '--strategy=cp on a sequence axis of 1 (--mesh=%s) splits no sequence: it runs '
            'as dp; give the second number of --mesh to split each sequence that many ways',
            plan.text(),
        )


def check_stage(plan, config, s, **_):
    """The stages take equal shares of a stack of equal layers."""
    if not hasattr(config, 'num_layers'):
        raise UsageError(
            f'{who(plan, STAGE)} splits a stack of equal layers into stages, and --model=mlp '
            'has none: use --model=transformer, or a mesh without a stage axis for the MLP'
        )
    divides('--num_layers', config.num_layers, 'stage axis', s, f'each stage holds '
            f'num_layers/{s} consecutive layers', f'multiple of {s}, or a mesh whose stage axis '
            f'divides {config.num_layers}')  # fmt: skip
    if s == 1 and plan.strategy == 'pp':
        logging.warning(
            '--strategy=pp on a stage axis of 1 (--mesh=%s) makes no pipeline: one stage holds '
            'every layer, and it runs as dp with microbatches; give the second number of --mesh '
            'to split the layers that many ways',
            plan.text(),
        )


def check_expert(plan, config, n, experts=0, **_):
    """Expert parallelism gives each of the n devices of the 'expert' axis E/n whole experts."""
    if not experts:
        raise UsageError(
            f'{who(plan, EXPERT)} splits the experts of a mixture-of-experts transformer: use '
            "--model=transformer --num_experts=E (a multiple of the mesh's expert axis)"
        )
    divides('--num_experts', experts, 'expert axis', n, f'each of its devices holds '
            f'num_experts/{n} whole experts', f'multiple of {n}, or a mesh whose expert axis '
            f'divides {experts}')  # fmt: skip


CHECKS = {MODEL: check_model, SEQ: check_seq, STAGE: check_stage, EXPERT: check_expert}


def check_rows(plan: Plan, batch_size: int, microbatches: int = 1) -> None:
    """Each device of the row axes takes batch_size / rows rows, cut into M microbatches."""
    rows = math.prod(plan.size(a) for a in plan.rows)
    axes = ' x '.join(f"'{a}'" for a in plan.rows) or 'no'
    if batch_size % rows:
        raise UsageError(
            f"--batch_size={batch_size} is not divisible by the {rows} devices of the mesh's "
            f'row axes ({axes}): each takes batch_size/{rows} examples; use a multiple of {rows}'
        )
    if microbatches < 1 or batch_size % (rows * microbatches):
        raise UsageError(
            f'--batch_size={batch_size} does not split into --microbatches={microbatches} on '
            f"each of the {rows} devices of the mesh's row axes ({axes}): use a --batch_size "
            f'divisible by {rows} x {microbatches} = {rows * microbatches}'
        )
