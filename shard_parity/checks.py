"""What a plan must satisfy, each check one line (docs/errors.md), before anything compiles:
what each axis splits must divide by it (heads and hidden units by 'model', the sequence by
'seq', the layers by 'stage', the experts by 'expert', the batch's rows by the row axes and the
microbatches), and the pipeline's schedule its constraints. The train CLI, the bisector, the
inspector and the benchmarks all refuse a plan here, with the same line
(shard_parity/runtime/from_flags.py checks the plan it builds).
"""

import math

from absl import logging

from shard_parity import UsageError
from shard_parity.plan import DATA, EXPERT, MODEL, MOE_STRATEGIES, SEQ, STAGE, Plan


def check(plan: Plan, model_config, batch_size: int) -> None:
    """Every used axis's check, the schedule's, then what the rows (and microbatches) must
    divide; warnings for axes that split nothing."""
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
            check_axis(plan, model_config, plan.size(axis), layout=plan.layout, experts=experts)
    check_schedule(plan, getattr(model_config, 'num_layers', 0))
    check_rows(plan, batch_size, plan.microbatches if plan.uses(STAGE) else 1)
    check_precision(plan)
    check_zero1(plan)
    for axis in plan.idle:
        if dict(plan.axes)[axis] > 1:
            logging.warning(
                "--strategy=%s splits nothing over '%s': the %d devices of each %s group hold "
                'the same shards and compute the same thing',
                plan.strategy, axis, dict(plan.axes)[axis], axis,
            )  # fmt: skip


def who(plan: Plan, axis: str) -> str:
    """How a message names what splits `axis`, as the user gave it: the named mesh's axis, or
    the strategy."""
    if plan.spelled.startswith('--mesh=') or plan.strategy == 'composed':
        return f"the {axis} axis of {plan.given()}"
    return f'--strategy={plan.strategy}'


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


def check_schedule(plan: Plan, layers: int) -> None:
    """--pp_schedule and --pp_virtual against the plan's stage axis S, the layers and the
    microbatches M (on a named mesh as under --strategy=pp: the composed step runs every
    schedule, in the twins that have it: step.strategy_file)."""
    schedule, virtual, stages, m = plan.schedule, plan.virtual, plan.size(STAGE), plan.microbatches
    if virtual is not None and schedule != 'interleaved':
        raise UsageError(
            f'--pp_virtual={virtual} needs --pp_schedule=interleaved (it is --pp_schedule='
            f'{schedule}): only the interleaved schedule gives each stage several chunks'
        )
    if schedule == 'gpipe':
        return
    if not plan.uses(STAGE):
        raise UsageError(
            f'--pp_schedule={schedule} orders the microbatches of a pipeline, and '
            f'{plan.given()} has no stage axis: use --strategy=pp (--mesh=DATAxSTAGE) or a '
            'named mesh with a stage axis, or drop --pp_schedule'
        )
    v = plan.chunks
    if schedule == 'interleaved' and v < 2:
        raise UsageError(
            f'--pp_virtual={v} must be 2 or more: each stage runs V chunks (V = 1 is '
            '--pp_schedule=1f1b)'
        )
    if layers % (stages * v):
        raise UsageError(
            f'--num_layers={layers} is not divisible by the stage axis x --pp_virtual '
            f'({stages} x {v} = {stages * v}): each stage runs {v} chunks of num_layers/'
            f'{stages * v} layers; use a multiple of {stages * v}'
        )
    if schedule == '1f1b' and m < stages:
        raise UsageError(
            f'--microbatches={m} is fewer than the stage axis ({stages}): 1F1B reaches its '
            'steady state, one forward and one backward per tick, only with a microbatch per '
            f'stage in flight; use --microbatches={stages} or more, or --pp_schedule=gpipe'
        )
    if schedule == 'interleaved' and m % stages:
        raise UsageError(
            f'--microbatches={m} is not a multiple of the stage axis ({stages}): the '
            'interleaved schedule sends the microbatches round the stages in groups of '
            f'{stages}; use {stages}, {2 * stages}, ...'
        )


def check_precision(plan: Plan) -> None:
    """--reduce_dtype names what the gradients' collectives carry: a mesh whose batch axes
    reduce nothing (one device, or only 'model' and 'stage', which split the weights) has
    none to carry it."""
    reduce = plan.precision.reduce
    if reduce != 'float32' and math.prod(plan.size(a) for a in plan.batch_axes) == 1:
        raise UsageError(
            f'--reduce_dtype={reduce} on {plan.given()}: nothing is reduced there (no axis over '
            "the batch, 'data', 'fsdp', 'expert' or 'seq', of 2 or more devices); drop "
            '--reduce_dtype, or give a mesh that splits the batch'
        )


def check_zero1(plan: Plan) -> None:
    """ZeRO-1 (--shard_optimizer_over_data) splits AdamW's moments over 'data': it needs a
    'data' axis of 2 or more, and runs the composed step (GPipe under 'stage')."""
    if not plan.zero1:
        return
    if plan.size(DATA) < 2:
        raise UsageError(
            f"--shard_optimizer_over_data splits AdamW's moments over the 'data' axis, and "
            f"{plan.given()} has no 'data' axis of 2 or more devices: give one (e.g. "
            '--mesh=data:8 or --mesh=data:4,model:2), or drop --shard_optimizer_over_data'
        )
    if plan.uses(STAGE) and plan.schedule != 'gpipe':
        raise UsageError(
            f'--shard_optimizer_over_data with --pp_schedule={plan.schedule}: ZeRO-1 runs the '
            'composed step, whose pipeline is GPipe; use --pp_schedule=gpipe or drop the flag'
        )
