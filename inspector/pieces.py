"""One piece per mesh axis: the collectives each axis the plan uses adds to a train step
(inspector/expect.py's table), read off the params' layout and the step's shapes
(inspector/records.py). Each piece takes the Step and returns its Expected records.
"""

import dataclasses
import math

from shard_parity.mesh import DATA, EXPERT, FSDP, MODEL, SEQ, STAGE
from shard_parity.model.mlp import MLPConfig
from shard_parity.schedules import interleave_pairs, one_f_one_b

from .records import Expected, Step, averaged_over, nbytes


def gradient(s: Step) -> list[Expected]:
    """The gradients' all-reduce over the batch axes, grouped by those axes: every array's
    shard (what its device keeps: 1/n of it under 'model', 'stage', 'expert', 'fsdp')."""
    groups = {}
    for a in s.arrays:
        axes, shard = averaged_over(s.plan, a), a.shard(s.plan)
        if a.zero1:  # over 'data' the `zero1` piece's reduce-scatter; the rest of its 1/n here
            axes, shard = tuple(x for x in axes if x != DATA), shard // s.plan.size(DATA)
        if math.prod(s.plan.size(x) for x in axes) > 1:
            groups[axes] = groups.get(axes, 0) + s.grads(shard)
    return [
        Expected('gradient', 'all-reduce', axes, 'outside-grad', total, 1,
                 f"the gradients' mean over {'/'.join(axes)}: each device's shard of every "
                 'array not split over these axes, once, after grad')
        for axes, total in groups.items()
    ]  # fmt: skip


def fsdp(s: Step) -> list[Expected]:
    """ZeRO-3 over 'fsdp' (n devices): a split array's gather brings back its shard x n, its
    gradient's reduce-scatter leaves the shard; an array fsdp cannot split is all-reduced over
    'fsdp'. The stacked blocks per layer, where it runs: forward, and again in the backward
    (the checkpointed layer is recomputed), with the reduce-scatter; the rest once a step.
    The gathers move --dtype (bf16: half float32's bytes), the gradients --reduce_dtype."""
    n = s.plan.size(FSDP)
    if n == 1:
        return []
    out = []
    for stacked in (False, True):
        arrays = [a for a in s.arrays if a.stacked == stacked]
        if not arrays:  # the MLP has no stacked layers
            continue
        split = sum(a.shard(s.plan) for a in arrays if FSDP in a.axes)
        whole = sum(a.shard(s.plan) for a in arrays if FSDP not in a.axes)
        if not stacked:
            out += [
                Expected('fsdp', 'all-gather', (FSDP,), 'outside-grad', s.weights(split * n), 1,
                         'the arrays outside the layers, gathered once before grad'),
                Expected('fsdp', 'reduce-scatter', (FSDP,), 'outside-grad', s.grads(split), 1,
                         "their gradients' mean, each device keeping its shard"),
                Expected('fsdp', 'all-reduce', (FSDP,), 'outside-grad', s.grads(whole), 1,
                         "the arrays fsdp cannot split (a size n does not divide): dp's mean"),
            ]  # fmt: skip
            continue
        k, trips = s.layers, s.per_layer
        if s.plan.size(STAGE) > 1 and s.plan.schedule == 'gpipe':  # XLA hoists the forward's
            # gathers out of the ticks' loop (1F1B's ticks gather per unit: `by_unit`)
            gather = Expected('fsdp', 'all-gather', (FSDP,), 'outside-grad',
                              s.weights(split * n // k), k,
                              "each of the stage's layers gathered once, before the ticks: the "
                              'weights do not change between ticks, and XLA hoists the '
                              'gathers out of the loop (they stay whole through the forward)')
        else:
            gather = Expected('fsdp', 'all-gather', (FSDP,), 'forward', s.weights(split * n // k),
                              trips, 'one layer gathered where it runs')
        out += [
            gather,
            Expected('fsdp', 'all-gather', (FSDP,), 'backward', s.weights(split * n // k), trips,
                     'gathered again: the checkpointed layer is recomputed'),
            Expected('fsdp', 'reduce-scatter', (FSDP,), 'backward', s.grads(split // k), trips,
                     "the layer's gradient, reduce-scattered where it is formed"),
            Expected('fsdp', 'all-reduce', (FSDP,), 'backward', s.grads(whole // k), trips,
                     "the layer's arrays fsdp cannot split: their gradients' mean"),
        ]  # fmt: skip
    return [e for e in out if e.bytes]


def model(s: Step) -> list[Expected]:
    """Tensor parallelism over 'model': an activation all-reduce after each row-parallel layer
    (forward) and before each column-parallel one (backward: its input's gradient)."""
    if s.plan.size(MODEL) == 1:
        return []
    if s.model == 'mlp':  # the second layer is row-parallel; the first's input is the data
        width = MLPConfig().layer_sizes[1]
        return [Expected('model', 'all-reduce', (MODEL,), 'forward',
                         s.rows // s.m * width * s.itemsize, s.ticks,
                         "the row-parallel second layer's partial sums (no backward one: the "
                         "first layer's input is the data)")]  # fmt: skip
    act = nbytes(s.activation, s.itemsize)
    ffn = nbytes(s.slots, s.itemsize) if s.moe else act  # MoE: the experts' slots, [E, b, cap, C]
    out = [
        Expected('model', 'all-reduce', (MODEL,), 'forward', act, s.per_layer,
                 "attention out's partial sums, " + str(list(s.activation))),
        Expected('model', 'all-reduce', (MODEL,), 'forward', ffn, s.per_layer,
                 "the feed-forward down's partial sums" + (' (per expert slot)' if s.moe else '')),
        Expected('model', 'all-reduce', (MODEL,), 'backward', act, 2 * s.per_layer,
                 "the input gradients of query and key_value (two layers, one input)"),
        Expected('model', 'all-reduce', (MODEL,), 'backward', ffn, s.per_layer,
                 "the feed-forward up's input gradient"),
    ]  # fmt: skip
    if s.remat:
        out.append(Expected('model', 'all-reduce', (MODEL,), 'backward', act, s.per_layer,
                            "attention out's, again: the checkpointed layer is recomputed"))
    if s.remat and s.moe:  # a dense feed-forward's output is not needed in its backward; the
        # experts' outputs are (the gates' gradient)
        out.append(Expected('model', 'all-reduce', (MODEL,), 'backward', ffn, s.per_layer,
                            "the experts' down partial sums, again (recomputed)"))
    return out


def seq(s: Step) -> list[Expected]:
    """Context parallelism's ring (shard_parity/model/ring.py), n devices round 'seq': per
    attention layer n - 1 passes of its K/V block, [b, T/n, K/m, D] in --dtype, forward; in the backward
    n - 1 passes of the keys, values and their gradients so far, and one more of the gradients.
    Under 'fsdp' the checkpointed layer is recomputed: its forward ring runs again in the
    backward. At n = 2 the loops run once: XLA inlines them and the backward's first pass of
    the keys and values is the forward's (common subexpressions), 2 fewer per layer, where both
    are in one computation (not under 'stage' without 'fsdp': the ticks' two loops)."""
    n = s.plan.size(SEQ)
    if n == 1:
        return []
    each = nbytes(ring_block(s), s.itemsize)
    # else in two loops: no CSE (a 1F1B unit of one layer: its vjp is one computation)
    shared = n == 2 and (s.remat or not s.plan.uses(STAGE) or s.one_layer_units)
    backward = 4 * (n - 1) + 2 + (2 * (n - 1) if s.remat else 0) - (2 if shared else 0)
    twins = ('explicit', 'typed')  # those with a RING; auto's attention is XLA's
    return [
        Expected('seq', 'collective-permute', (SEQ,), 'forward', each, 2 * (n - 1) * s.per_layer,
                 f'the keys and values, {n - 1} passes round each ring of {n}', twins),
        Expected('seq', 'collective-permute', (SEQ,), 'backward', each, backward * s.per_layer,
                 'the keys, values and their gradients round the ring, and the gradients home',
                 twins),
    ]  # fmt: skip


def ring_block(s: Step) -> tuple[int, ...]:
    c, n = s.c, s.plan.size(SEQ)
    return (s.rows // s.m, c.seq_len // n, c.num_kv_heads // s.plan.size(MODEL), c.head_dim)


def stage(s: Step) -> list[Expected]:
    """GPipe over 'stage': one collective-permute of one microbatch's activations per tick,
    stage i to i + 1 forward and back (the transpose); the last stage's outputs all-reduced to
    every stage, and in the backward stage 0's input gradient. No weight moves. 1F1B and
    interleaved: `scheduled`."""
    if s.plan.size(STAGE) == 1:
        return []
    if s.plan.schedule != 'gpipe':
        return scheduled(s)
    act = nbytes(s.activation, s.itemsize)
    whole = act * s.m  # all M microbatches: the device's rows
    twins = ('explicit', 'typed')  # auto's pipeline is a shifted buffer: XLA's own collectives
    return [
        Expected('stage', 'collective-permute', (STAGE,), 'forward', act, s.ticks,
                 'a microbatch from stage i to i + 1, every tick', twins),
        Expected('stage', 'collective-permute', (STAGE,), 'backward', act, s.ticks,
                 'its gradient from stage i + 1 back to i, every tick', twins),
        Expected('stage', 'all-reduce', (STAGE,), 'forward', whole, 1,
                 "the last stage's outputs, to every stage (the head runs on each)"),
        Expected('stage', 'all-reduce', (STAGE,), 'backward', whole, 1,
                 "stage 0's input gradient, once after the ticks"),
    ]  # fmt: skip


def scheduled(s: Step) -> list[Expected]:
    """1F1B and interleaved over 'stage', their ticks run outside grad by shard_parity/pipeline.py
    in three loops (schedules.one_f_one_b's phases: W warm-up, N steady, C cool-down ticks):
    a microbatch's activations handed on at each of the W + N ticks that run forwards, a
    gradient handed back at each of the N + C that run backwards (a cool-down of one tick is a
    loop XLA unrolls, and its last hand-over, which nothing reads, is dropped); the gradients
    outside the blocks (the embeddings, the final norm: formed on the first and last stages)
    summed over the stages once, with the metrics. Interleaved (V > 1) also moves each stage's
    V chunks to the stages that run them before the ticks, and their gradients back after."""
    warm, steady, cool = one_f_one_b(s.plan.size(STAGE), s.m, s.plan.chunks).phases
    act = nbytes(s.activation, s.itemsize)
    # as gathered: under 'fsdp' the rest is gathered once before the ticks, scattered after
    rest = sum(a.shard(s.plan) * (s.plan.size(FSDP) if FSDP in a.axes else 1)
               for a in s.arrays if not a.stacked)  # fmt: skip
    twins = ('explicit', 'auto', 'typed')
    out = [
        Expected('stage', 'collective-permute', (STAGE,), 'outside-grad', act, warm + steady,
                 'a microbatch from stage i to i + 1, at every tick that runs forwards', twins),
        Expected('stage', 'collective-permute', (STAGE,), 'outside-grad', act,
                 steady + cool - (cool == 1),
                 'its gradient from stage i + 1 back to i, at every tick that runs backwards',
                 twins),
        Expected('stage', 'all-reduce', (STAGE,), 'outside-grad', s.grads(rest), 1,
                 "the gradients outside the blocks, summed over the stages once (the metrics' "
                 'scalars with them)', twins),
    ]  # fmt: skip
    if s.plan.chunks > 1:  # explicit/pp_1f1b.py's interleave, inside grad: one ppermute per
        # (chunk sent, chunk received) of schedules.interleave_pairs, each of one chunk; those
        # whose every pair is a stage sending to itself name no axis (the inspector's groups)
        pairs = interleave_pairs(s.plan.size(STAGE), s.plan.chunks).values()
        cross = sum(any(a != b for a, b in moves) for moves in pairs)
        chunk = sum(a.shard(s.plan) for a in s.arrays if a.stacked) // s.plan.chunks
        for phase, what in (('forward', "each stage's chunks of layers to the stages that run "
                             'them'), ('backward', 'their gradients back')):  # fmt: skip
            out += [
                Expected('stage', 'collective-permute', (STAGE,), phase, chunk, cross, what,
                         ('explicit',)),
                Expected('stage', 'collective-permute', (), phase, chunk, len(pairs) - cross,
                         what + ' (a stage to itself)', ('explicit',)),
            ]  # fmt: skip
    return out


def expert(s: Step) -> list[Expected]:
    """Expert parallelism over 'expert': per MoE layer every device's slots to the experts'
    devices and the outputs back (forward), their gradients the same ways reversed."""
    if s.plan.size(EXPERT) == 1 or not s.moe:
        return []
    each = nbytes(s.slots, s.itemsize)
    return [
        Expected('expert', 'all-to-all', (EXPERT,), 'forward', each, 2 * s.per_layer,
                 'the slots to the experts, the outputs back'),
        Expected('expert', 'all-to-all', (EXPERT,), 'backward', each, 2 * s.per_layer,
                 'the gradients of both, the reverse ways'),
    ] + [
        Expected('expert', 'all-to-all', (EXPERT,), 'backward', each, 2 * s.per_layer,
                 'the forward two again: the checkpointed layer is recomputed')
        for _ in range(s.remat)
    ]  # fmt: skip


def zero1(s: Step) -> list[Expected]:
    """ZeRO-1 (--shard_optimizer_over_data, docs/zero1.md): the gradients whose moments split
    over 'data' reduce-scattered there, each device keeping 1/n (in --reduce_dtype), and those
    params, updated on the 1/n, all-gathered whole again (float32, the master weights) once a
    step; none of the moments move."""
    split = sum(a.shard(s.plan) for a in s.arrays if a.zero1)
    if not s.plan.zero1 or not split:
        return []
    n = s.plan.size(DATA)
    return [
        Expected('zero1', 'reduce-scatter', (DATA,), 'outside-grad', s.grads(split // n), 1,
                 "the gradients' mean over 'data', each device keeping the 1/n its moments hold"),
        Expected('zero1', 'all-gather', (DATA,), 'outside-grad', split, 1,
                 'the params updated on each 1/n, whole again: once a step, after the update'),
    ]  # fmt: skip


PIECES = {'gradient': gradient, FSDP: fsdp, MODEL: model, SEQ: seq, STAGE: stage, EXPERT: expert}
PIECES['zero1'] = zero1  # not an axis: 'data' under --shard_optimizer_over_data


def per_microbatch(s: Step) -> str:
    """What a record in the forward or backward adds under --gradient_accumulation_steps=K: it
    runs in each microbatch's pass (FSDP's per-layer gathers and scatters, ZeRO-3's nature, in
    every twin: docs/accumulation.md); the reductions after grad run once a step."""
    return f', once per microbatch (K = {s.k})' if s.k > 1 and not s.plan.uses(STAGE) else ''


def collectives(s: Step) -> list[Expected]:
    """Every piece's records, in PIECES' order (under 1F1B and interleaved, `by_unit`'s); under
    --gradient_accumulation_steps=K those in the forward and backward say they run per
    microbatch (`per_microbatch`)."""
    records = [e for piece in PIECES.values() for e in piece(s)]
    if s.k > 1:
        records = [e if e.phase == 'outside-grad' else dataclasses.replace(
            e, what=e.what + per_microbatch(s)) for e in records]  # fmt: skip
    return by_unit(s, records) if s.plan.uses(STAGE) and s.plan.schedule != 'gpipe' else records


def by_unit(s: Step, records: list[Expected]) -> list[Expected]:
    """The per-layer records inside a stage (fsdp's gathers, tp's sums, the ring, the experts'
    exchange), GPipe's counted per tick, recounted for 1F1B's and interleaved's loops
    (shard_parity/pipeline.py): a tick runs one unit (a chunk of L/(SV) layers) whether or not
    the table turns it on, so a forward-unit op runs at each of the W + N ticks that run
    forwards, outside grad, and again in each of the N + C backward units' `jax.vjp` (phase
    forward; in a unit of one layer fsdp's gather there is the recompute's: one op), and a
    backward op at each of those N + C (phase backward)."""
    warm, steady, cool = one_f_one_b(s.plan.size(STAGE), s.m, s.plan.chunks).phases
    out = []
    for e in records:
        if e.piece in ('gradient', STAGE) or e.phase == 'outside-grad':
            out.append(e)
            continue
        per_tick = e.trips // (s.ticks * s.plan.chunks)  # per unit of one chunk
        if e.phase == 'forward':
            out.append(dataclasses.replace(e, phase='outside-grad', trips=per_tick * (warm + steady),
                                           what=e.what + ': the forward units, outside grad'))
            if not (e.piece == FSDP and s.one_layer_units):  # else the recompute's gather is it
                out.append(dataclasses.replace(e, trips=per_tick * (steady + cool),
                                               what=e.what + ": again in each backward unit's vjp"))
        else:
            out.append(dataclasses.replace(e, trips=per_tick * (steady + cool)))
    return out
