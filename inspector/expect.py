"""The analytic collectives of one train step, composed from one piece per mesh axis: what the
twins' compiled programs are compared against.

Each axis the plan uses adds its piece (inspector/pieces.py, `PIECES`), read off the params'
layout under the plan (shard_parity/placement.py) and the step's shapes (inspector/records.py):

    gradient  each gradient all-reduced over the batch axes it is not split over ('data',
              'seq', 'expert'; not 'fsdp', whose reduce-scatter averages), once, after grad
    fsdp      each layer's weights all-gathered where it runs, again in the backward (the layer
              is recomputed), their gradient reduce-scattered there; the rest once per step
    model     the activations' all-reduces: forward after each row-parallel layer (attention
              out, the feed-forward's down), backward before each column-parallel one
    seq       the ring: each attention layer's K/V blocks passed round 'seq'
    stage     one collective-permute of a microbatch per tick, each way; the outputs'
              all-reduce over 'stage' and stage 0's input gradient's
    expert    four all-to-alls of the experts' slots per MoE layer, two each way

A record (`Expected`) is one kind of op over one set of mesh axes in one phase, with the bytes
one op moves (the size of its HLO result) and how many times it runs in a step (ops x loop
trips; under --gradient_accumulation_steps=K a per-layer record's trips count each of the K
microbatches). `expectation()` returns them, and the figures that the single strategies' tests
pinned before the composition (gradient_bytes, activations, ring, stages, all_to_all), read off the
same layout. The metrics' means and the global norm's partial sums (scalars) are left out.
How a compiled program's collectives are held against the records: inspector/reconcile.py.
"""

import math

from shard_parity.mesh import EXPERT, FSDP, MODEL, SEQ, STAGE
from shard_parity.model.mlp import MLPConfig
from shard_parity.schedules import one_f_one_b

from .pieces import collectives, ring_block
from .records import Expected, Step, step_of


def expectation(plan, model: str, params, mesh, batch_size: int, model_config,
                accumulation: int = 1) -> dict:  # fmt: skip
    """The analytic collectives of one step (`collectives`: the records, as dicts), and the
    figures read off them: the gradient's reduction over the batch axes ('gradient_bytes',
    per device), the activations' over 'model', the ring's, the stages', the all-to-alls.
    `accumulation`: --gradient_accumulation_steps=K, the step's K microbatches: whatever runs
    in the forward and backward (a layer's gathers, scatters and sums, the ring, the experts'
    exchange) runs once per microbatch on 1/K of the rows; the reductions after grad once."""
    s = step_of(plan, model, params, mesh, batch_size, model_config, accumulation)
    records = collectives(s)
    expected = summary(s, records)
    expected['collectives'] = [e.json() for e in records]
    return expected


def gradient_bytes(s: Step) -> tuple[int, int]:
    """(the bytes each device's gradient holds of the arrays every batch axis averages, those
    of the experts' under 'expert', in --reduce_dtype): under 'fsdp' whole, as its gather
    brings it back."""
    not_fsdp = lambda a: tuple(x for x in a.axes if x != FSDP)  # noqa: E731
    whole = lambda a: a.whole // math.prod(s.plan.size(x) for x in not_fsdp(a))  # noqa: E731
    split = lambda a: s.plan.uses(EXPERT) and EXPERT in a.axes  # noqa: E731
    return (
        s.grads(sum(whole(a) for a in s.arrays if not split(a))),
        s.grads(sum(whole(a) for a in s.arrays if split(a))),
    )


def summary(s: Step, records: list[Expected]) -> dict:
    """The figures the single-strategy tests pin: the gradient reduction's kind, group and bytes,
    and each piece's own summary ('activations', 'ring', 'stages', 'all_to_all')."""
    plan = s.plan
    n = math.prod(plan.size(a) for a in plan.batch_axes)  # devices whose loss terms differ
    grads, experts = gradient_bytes(s)
    ring = 2 * (n - 1) / n * grads
    by = ', '.join(f"'{a}'" for a in plan.batch_axes) or 'no axis'
    note = (
        f'the gradients averaged over {by} (plus the averaged metric scalars): each array once, '
        'over the batch axes it is not split over; XLA may combine them into tuple-shaped ops. '
        'A ring moves 2(N-1)/N of it.'
    )
    if plan.uses(FSDP):
        note += (
            " Under 'fsdp' each split weight is all-gathered where it is used and its gradient "
            "reduce-scattered ((N-1)/N of it over the wire each): the same bytes as one "
            'all-reduce, in two halves.'
        )
    if plan.zero1:
        note += (
            " Under ZeRO-1 (--shard_optimizer_over_data) each gradient whose moments split over "
            "'data' is reduce-scattered there instead, and its param all-gathered once updated "
            '(the `zero1` records): the same bytes as the all-reduce, in two halves.'
        )
    expected = {
        'kind': 'all-gather + reduce-scatter' if plan.uses(FSDP) or plan.zero1 else 'all-reduce',
        'group_size': n,
        'gradient_bytes': grads,
        'ring_bytes_per_device': ring,
        'note': note,
        'activations': None,
    }
    if plan.uses(EXPERT):
        e = n // plan.size(EXPERT)  # the experts' gradients: over the other batch axes
        expected['expert_gradient_bytes'] = experts
        expected['ring_bytes_per_device'] = ring + 2 * (e - 1) / e * experts
    over_model = [r for r in records if r.piece == MODEL]
    if over_model:
        m = plan.size(MODEL)
        count = sum(r.trips for r in over_model)
        total = sum(r.total for r in over_model)
        shape = (s.rows // s.m, MLPConfig().layer_sizes[1]) if s.model == 'mlp' else s.activation
        expected['activations'] = {
            'kind': 'all-reduce', 'group_size': m, 'count': count, 'shape': shape,
            'bytes': total, 'ring_bytes_per_device': 2 * (m - 1) / m * total,
            'note': '; '.join(r.what for r in over_model),
        }  # fmt: skip
    if plan.size(SEQ) > 1:
        expected['ring'] = ring_summary(s, [r for r in records if r.piece == SEQ])
    if plan.size(STAGE) > 1:
        expected['stages'] = stage_summary(s, [r for r in records if r.piece == STAGE])
    if plan.size(EXPERT) > 1 and s.moe:
        a2a = [r for r in records if r.piece == EXPERT]
        count, each = sum(r.trips for r in a2a), a2a[0].bytes
        k = plan.size(EXPERT)
        expected['all_to_all'] = {
            'kind': 'all-to-all', 'group_size': k, 'per_layer': 4, 'count': count,
            'shape': s.slots, 'bytes_each': each, 'bytes': count * each,
            'wire_bytes_per_device': count * each * (k - 1) / k,
            'note': "per MoE layer: forward, every device's slots to the experts' devices and "
            'the outputs back; backward, the gradients of both, reversed. Each device keeps '
            '1/n of its slots (its own experts) and sends the rest.',
        }  # fmt: skip
    return expected


def ring_summary(s: Step, records: list[Expected]) -> dict:
    n, runs = s.plan.size(SEQ), sum(r.trips for r in records) // s.per_layer
    each = records[0].bytes
    # ops in the program: the loops' bodies (forward k, v; backward k, v, dk, dv), the last
    # pass (dk, dv), the recomputed forward's loop under 'fsdp'; at n = 2 no loops: every run
    ops = (8 + 2 * s.remat) if n > 2 else runs
    copies = 1 + (s.m > 1 and not s.plan.uses(STAGE))  # K: the first microbatch's, the loop's
    return {
        'kind': 'collective-permute',
        'group_size': s.plan.devices,  # one ring per group of the other axes: a pair per device
        'ring_size': n,
        'count': ops * s.layers * copies,  # unrolled layers (a scan's body holds one layer's)
        'per_layer': ops,
        'shape': ring_block(s),
        'bytes_each': each,
        'runs_per_layer': runs,
        'bytes': runs * s.per_layer * each,
        'note': f'the twins with a ring (explicit, typed): per attention layer, {n - 1} passes of '
        f'the keys and values round each ring of {n} (forward, one loop), {n - 1} of the keys, '
        'values and their gradients so far (backward, one loop), and one more of the gradients, '
        'home; one collective-permute per array and pass.',
    }


def stage_summary(s: Step, records: list[Expected]) -> dict:
    stages, ticks = s.plan.size(STAGE), s.ticks
    act = records[0].bytes
    if s.plan.schedule != 'gpipe':  # 1F1B, interleaved: pieces.scheduled
        # the hand-overs: its permutes outside grad (interleaved's chunk moves are in grad)
        sends = [e for e in records if e.kind == 'collective-permute' and e.phase == 'outside-grad']
        v, phases = s.plan.chunks, one_f_one_b(stages, s.m, s.plan.chunks).phases
        warm, steady, cool = phases
        return {
            'kind': 'collective-permute',
            'schedule': s.plan.schedule,
            'stages': stages,
            'microbatches': s.m,
            'virtual': v,
            'ticks': sum(phases),
            'phases': list(phases),
            'shape': s.activation,
            'bytes_each': act,
            # in the program: one per loop that hands over (a one-tick cool-down's is dropped)
            'count': (warm > 0) + 2 * (steady > 0) + (cool > 1),
            'runs': sum(e.trips for e in sends),
            'bytes': sum(e.total for e in sends),
            'bubble': (stages - 1) / (v * s.m + stages - 1),
            'note': f'{s.plan.schedule}: ticks in three loops (warm-up {phases[0]}, steady '
            f'{phases[1]}, cool-down {phases[2]}), outside grad; a microbatch handed on at each '
            'tick that runs forwards, its gradient back at each that runs backwards; the '
            'gradients outside the blocks all-reduced over the stages once.',
        }
    return {
        'kind': 'collective-permute',
        'stages': stages,
        'microbatches': s.m,
        'ticks': ticks,
        'shape': s.activation,
        'bytes_each': act,
        'count': 2,  # in the program: the forward's and the backward's
        'runs': 2 * ticks,
        'bytes': 2 * ticks * act,
        'bubble': (stages - 1) / ticks,
        'note': f'explicit and typed: one collective-permute of one microbatch activation per '
        f'tick, {ticks} ticks (M + S - 1), stage i to i + 1 in the forward and i + 1 to i in the '
        f"backward (its transpose); {stages - 1} of {stages} devices of each 'stage' group send. "
        "No all-gather of the stages' weights.",
    }
