"""The fuzzer's own table of what a configuration must satisfy (python -m tools.fuzz), written
apart from shard_parity/checks.py and plan.py, so that the checks are not their own oracle.

Each row is a constraint stated from what the axes do (docs/composition.md): what an axis
splits must divide by its size. `violations(draw)` lists the rows a draw breaks, each with the
flag a refusal must name; the fuzzer holds every refusal the project makes against it (a
refusal the table does not predict, or whose line names none of the broken rows, is a failure,
and so is a draw the table refuses that runs).

On a named mesh every axis given does its job (size 1 included): the mesh names the file.
"""

import math
from typing import NamedTuple

ROWS = ('data', 'fsdp', 'expert')  # each device of these takes its own rows of the batch
REDUCED = (*ROWS, 'seq')  # a gradient is a mean over these: --reduce_dtype needs one of 2+
MLP_HIDDEN = 512  # the MLP's hidden width, which 'model' splits
POLICIES = ('none', 'full', 'dots', 'dots_no_batch')  # --remat_policy's (docs/remat.md)


class Broken(NamedTuple):
    flag: str  # what a refusal must name, e.g. '--num_heads' ('--model=mlp' for an axis it lacks)
    why: str


def violations(d) -> list[Broken]:
    """The constraints draw `d` (tools/fuzz/draws.py's Draw) breaks, in no particular order."""
    axes, out = dict(d.mesh), []

    def need(ok: bool, flag: str, why: str):
        if not ok:
            out.append(Broken(flag, why))

    t = d.model == 'transformer'
    experts = d.experts if t else 0
    for axis in ('seq', 'stage'):
        need(t or axis not in axes, '--model=mlp', f"'{axis}' splits what the MLP has none of")
    need(experts or 'expert' not in axes, '--num_experts', "'expert' splits experts: none")
    m = axes.get('model', 1)
    if t:
        need(d.heads % m == 0, '--num_heads', f"'model' ({m}) splits the query heads")
        need(d.kv_heads % m == 0, '--num_kv_heads', f"'model' ({m}) splits the kv heads")
    else:
        need(MLP_HIDDEN % m == 0, 'hidden layer width', f"'model' ({m}) splits the hidden units")
    if t and 'seq' in axes:
        n = axes['seq']
        need(not (experts and n > 1), '--num_experts', 'capacity is per whole sequence')
        chunks = 2 * n if d.layout == 'zigzag' else n
        need(d.seq_len % chunks == 0, '--seq_len', f'{chunks} equal chunks of the sequence')
    if t and 'stage' in axes:
        need(d.layers % axes['stage'] == 0, '--num_layers', 'equal stages of layers')
    if experts and 'expert' in axes:
        need(experts % axes['expert'] == 0, '--num_experts', 'whole experts per device')
    schedule(d, axes, experts, need)
    rows = math.prod(axes.get(a, 1) for a in ROWS)
    need(d.batch % rows == 0, '--batch_size', f'{rows} row devices take equal rows')
    if 'stage' in axes:
        need(d.batch % (rows * d.microbatches) == 0, '--batch_size', 'equal microbatches')
    reduced = math.prod(axes.get(a, 1) for a in REDUCED)
    need(d.reduce_dtype == 'float32' or reduced > 1, '--reduce_dtype', 'nothing is reduced')
    step_options(d, axes, rows, need)
    return out


def step_options(d, axes, rows: int, need) -> None:
    """K (--gradient_accumulation_steps) cuts each row device's rows into K equal microbatches,
    which a pipeline does already (its M); ZeRO-1 splits AdamW's moments over 'data' (2+), in
    the composed step, whose pipeline is GPipe; a remat policy checkpoints transformer blocks,
    which the MLP has none of ('none' checkpoints nothing); a partial window (the bisector's
    --partial_window) holds fewer than K microbatches; documents are the transformer's text."""
    k, flag = d.accumulation, '--gradient_accumulation_steps'
    need(k >= 1, flag, 'K microbatches: a count of 1 or more')
    if k > 1:
        need('stage' not in axes, flag, "a pipeline's M microbatches are its accumulation")
        need((d.batch // rows) % k == 0, flag, f'K ({k}) equal parts of each row device\'s rows')
    if d.zero1:
        flag = '--shard_optimizer_over_data'
        need(axes.get('data', 1) >= 2, flag, "AdamW's moments split over a 'data' axis of 2+")
        need('stage' not in axes or d.schedule == 'gpipe', flag, "the composed step's GPipe")
    need(d.remat in (None, *POLICIES), '--remat_policy', f'one of {", ".join(POLICIES)}')
    need(d.remat in (None, 'none') or d.model == 'transformer', '--remat_policy',
         'the MLP has no blocks to checkpoint')  # fmt: skip
    need(not d.partial or 1 <= d.partial < k, '--partial_window',
         f'a partial window holds 1 to K-1 of K ({k}) microbatches')  # fmt: skip
    need(not d.variable_length or d.model == 'transformer', '--variable_length',
         "documents cut from text: the transformer's")  # fmt: skip


def twin_refusals(d, twin: str) -> list[Broken]:
    """What one twin refuses of a draw the table accepts (the others run it): auto/ and typed/
    never reduce in less than float32 (their partitioner reduces a gradient where it is
    formed, before their cast). A zoo entry or a module of yours refuses nothing."""
    out = []
    if twin in ('auto', 'typed') and d.reduce_dtype != 'float32':
        out.append(Broken('--reduce_dtype', f'{twin} reduces in float32 where formed'))
    return out


def schedule(d, axes, experts, need) -> None:
    """1F1B and interleaved: a pipeline (a stage axis, whatever else runs inside a stage, the
    experts included), V chunks of equal layers per stage, enough microbatches in flight."""
    if d.schedule == 'gpipe':
        return
    pipeline = 'stage' in axes
    need(pipeline, '--pp_schedule', 'only a pipeline takes this schedule')
    if not pipeline:
        return
    s, v = axes['stage'], (d.virtual if d.schedule == 'interleaved' else 1)
    need(d.layers % (s * v) == 0, '--num_layers', f'{s} stages x {v} chunks of equal layers')
    if d.schedule == '1f1b':
        need(d.microbatches >= s, '--microbatches', 'a microbatch per stage in flight')
    else:
        need(d.microbatches % s == 0, '--microbatches', 'microbatches in groups of S')


def agrees(message: str, broken: list[Broken]) -> bool:
    """Whether a refusal's line names one of the broken constraints."""
    return any(b.flag in message for b in broken)
