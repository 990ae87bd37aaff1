"""The analytic collectives of one train step, composed from one piece per mesh axis: what the
twins' compiled programs are compared against.

Each axis the plan uses adds its piece (`PIECES`), read off the params' layout under the plan
(shard_parity/placement.py) and the step's shapes:

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
trips). `expectation()` returns them, and the figures that the single strategies' tests pinned
before the composition (gradient_bytes, activations, ring, stages, all_to_all), read off the
same layout. The metrics' means and the global norm's partial sums (scalars) are left out.
"""

import dataclasses
import math

import jax
import numpy as np

from shard_parity import plan as plans
from shard_parity.mesh import EXPERT, FSDP, MODEL, SEQ, STAGE
from shard_parity.model.mlp import MLPConfig
from shard_parity.model.moe import capacity
from shard_parity.placement import is_expert, layer_dims, state_specs

from .hlo import _BYTES

TWINS = ('auto', 'explicit', 'typed')


@dataclasses.dataclass(frozen=True)
class Expected:
    """Identical collectives of one axis's piece: `trips` ops (or loop trips) of `bytes` each."""

    piece: str  # the axis whose piece it is ('gradient': the batch axes' reduction)
    kind: str
    axes: tuple[str, ...]  # the mesh axes it runs over
    phase: str  # 'forward', 'backward' or 'outside-grad', as the inspector attributes ops
    bytes: int  # one op's result
    trips: int  # how many run per step
    what: str
    twins: tuple[str, ...] = TWINS  # the twins that write it (auto has no ring, no ppermute)

    @property
    def total(self) -> int:
        return self.bytes * self.trips

    def json(self) -> dict:
        return dataclasses.asdict(self) | {'total': self.total}


@dataclasses.dataclass(frozen=True)
class Array:
    """One parameter: its bytes whole, the mesh axes its layout splits it over."""

    whole: int
    axes: tuple[str, ...]
    stacked: bool  # one of the transformer's stacked blocks' arrays, [L, ...]
    expert: bool  # a mixture of experts' expert weights

    def shard(self, plan) -> int:
        """The bytes each device holds (and its gradient, once reduced)."""
        return self.whole // math.prod(plan.size(a) for a in self.axes)


@dataclasses.dataclass(frozen=True)
class Step:
    """What the pieces read: the plan, each parameter's layout, the step's shapes."""

    plan: plans.Plan
    model: str
    arrays: tuple[Array, ...]
    batch_size: int
    c: object  # the TransformerConfig (unused by the MLP)
    microbatches: int

    @property
    def rows(self) -> int:  # each device's rows of the batch
        return self.batch_size // math.prod(self.plan.size(a) for a in self.plan.rows)

    @property
    def m(self) -> int:  # microbatches: under 'stage' only
        return self.microbatches if self.plan.uses(STAGE) else 1

    @property
    def ticks(self) -> int:  # GPipe's M + S - 1
        return self.m + self.plan.size(STAGE) - 1 if self.plan.uses(STAGE) else 1

    @property
    def layers(self) -> int:  # each device's layers: L, or a stage's L/S
        return self.c.num_layers // self.plan.size(STAGE)

    @property
    def per_layer(self) -> int:
        """How often a per-layer op runs in a step: L, or each stage's L/S layers every tick."""
        return self.layers * self.ticks

    @property
    def activation(self) -> tuple[int, ...]:  # x: [b, T, C] of one microbatch, my positions
        return (self.rows // self.m, self.c.seq_len // self.plan.size(SEQ), self.c.embed_dim)

    @property
    def itemsize(self) -> int:
        return np.dtype(self.c.compute_dtype).itemsize

    @property
    def slots(self) -> tuple[int, ...]:  # a MoE layer's slots, [E, b, cap, C]
        c = self.c
        return (c.num_experts, self.rows // self.m, capacity(c, c.seq_len), c.embed_dim)

    @property
    def moe(self) -> bool:
        return self.model == 'transformer' and bool(self.c.num_experts)

    @property
    def remat(self) -> bool:
        """Whether each layer runs again in the backward: under 'fsdp' the layer is checkpointed
        (Transformer.run_stack), so that only one layer's weights are whole at a time."""
        return self.model == 'transformer' and self.plan.uses(FSDP) and self.plan.size(FSDP) > 1


def step_of(plan, model, params, mesh, batch_size, c) -> Step:
    specs = jax.tree.leaves(state_specs(params, plan, mesh))
    arrays = []
    for (path, p), spec in zip(jax.tree_util.tree_leaves_with_path(params), specs, strict=True):
        axes = tuple(a for d in spec if d for a in (d if isinstance(d, tuple) else (d,)))
        arrays.append(
            Array(int(np.prod(p.shape)) * p.dtype.itemsize, axes, bool(layer_dims(path)),
                  is_expert(path))
        )  # fmt: skip
    return Step(plan, model, tuple(arrays), batch_size, c, plan.microbatches)


def nbytes(shape, itemsize: int = 4) -> int:
    return int(np.prod(shape)) * itemsize


def averaged_over(plan, array: Array) -> tuple[str, ...]:
    """The batch axes a gradient is all-reduced over: not those it is split over, nor 'fsdp'
    (its reduce-scatter averages), as explicit/composed.py's `averaged_over`."""
    return tuple(a for a in plan.batch_axes if a not in array.axes and a != FSDP)


# --- One piece per axis. Each returns the Expected records its axis adds to the step.


def gradient(s: Step) -> list[Expected]:
    """The gradients' all-reduce over the batch axes, grouped by those axes: every array's
    shard (what its device keeps: 1/n of it under 'model', 'stage', 'expert', 'fsdp')."""
    groups = {}
    for a in s.arrays:
        axes = averaged_over(s.plan, a)
        if math.prod(s.plan.size(x) for x in axes) > 1:
            groups[axes] = groups.get(axes, 0) + a.shard(s.plan)
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
    (the checkpointed layer is recomputed), with the reduce-scatter; the rest once a step."""
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
                Expected('fsdp', 'all-gather', (FSDP,), 'outside-grad', split * n, 1,
                         'the arrays outside the layers, gathered once before grad'),
                Expected('fsdp', 'reduce-scatter', (FSDP,), 'outside-grad', split, 1,
                         "their gradients' mean, each device keeping its shard"),
                Expected('fsdp', 'all-reduce', (FSDP,), 'outside-grad', whole, 1,
                         "the arrays fsdp cannot split (a size n does not divide): dp's mean"),
            ]  # fmt: skip
            continue
        k, trips = s.layers, s.per_layer
        if s.plan.size(STAGE) > 1:  # XLA hoists the forward's gathers out of the ticks' loop
            gather = Expected('fsdp', 'all-gather', (FSDP,), 'outside-grad', split * n // k, k,
                              "each of the stage's layers gathered once, before the ticks: the "
                              'weights do not change between ticks, and XLA hoists the '
                              'gathers out of the loop (they stay whole through the forward)')
        else:
            gather = Expected('fsdp', 'all-gather', (FSDP,), 'forward', split * n // k, trips,
                              'one layer gathered where it runs')
        out += [
            gather,
            Expected('fsdp', 'all-gather', (FSDP,), 'backward', split * n // k, trips,
                     'gathered again: the checkpointed layer is recomputed'),
            Expected('fsdp', 'reduce-scatter', (FSDP,), 'backward', split // k, trips,
                     "the layer's gradient, reduce-scattered where it is formed"),
            Expected('fsdp', 'all-reduce', (FSDP,), 'backward', whole // k, trips,
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
        return [Expected('model', 'all-reduce', (MODEL,), 'forward', s.rows * width * 4, 1,
                         "the row-parallel second layer's partial sums (no backward one: the "
                         "first layer's input is the data)")]  # fmt: skip
    act = nbytes(s.activation, s.itemsize)
    ffn = nbytes(s.slots, s.itemsize) if s.moe else act  # MoE: the experts' slots, [E, b, cap, C]
    out = [
        Expected('model', 'all-reduce', (MODEL,), 'forward', act, s.per_layer,
                 "attention out's partial sums, f32" + str(list(s.activation))),
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
    attention layer n - 1 passes of its K/V block, f32[b, T/n, K/m, D], forward; in the backward
    n - 1 passes of the keys, values and their gradients so far, and one more of the gradients.
    Under 'fsdp' the checkpointed layer is recomputed: its forward ring runs again in the
    backward. At n = 2 the loops run once: XLA inlines them and the backward's first pass of
    the keys and values is the forward's (common subexpressions), 2 fewer per layer, where both
    are in one computation (not under 'stage' without 'fsdp': the ticks' two loops)."""
    n = s.plan.size(SEQ)
    if n == 1:
        return []
    each = nbytes(ring_block(s))
    shared = n == 2 and (s.remat or not s.plan.uses(STAGE))  # else in two loops: no CSE
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
    every stage, and in the backward stage 0's input gradient. No weight moves."""
    if s.plan.size(STAGE) == 1:
        return []
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


PIECES = {'gradient': gradient, FSDP: fsdp, MODEL: model, SEQ: seq, STAGE: stage, EXPERT: expert}


def collectives(s: Step) -> list[Expected]:
    """Every piece's records, in PIECES' order."""
    return [e for piece in PIECES.values() for e in piece(s)]


def expectation(plan, model: str, params, mesh, batch_size: int, model_config) -> dict:
    """The analytic collectives of one step (`collectives`: the records, as dicts), and the
    figures read off them: the gradient's reduction over the batch axes ('gradient_bytes',
    per device), the activations' over 'model', the ring's, the stages', the all-to-alls."""
    s = step_of(plan, model, params, mesh, batch_size, model_config)
    records = collectives(s)
    expected = summary(s, records)
    expected['collectives'] = [e.json() for e in records]
    return expected


def gradient_bytes(s: Step) -> tuple[int, int]:
    """(the bytes each device's gradient holds of the arrays every batch axis averages, those
    of the experts' under 'expert'): under 'fsdp' whole, as its gather brings it back."""
    not_fsdp = lambda a: tuple(x for x in a.axes if x != FSDP)  # noqa: E731
    whole = lambda a: a.whole // math.prod(s.plan.size(x) for x in not_fsdp(a))  # noqa: E731
    split = lambda a: s.plan.uses(EXPERT) and EXPERT in a.axes  # noqa: E731
    return (
        sum(whole(a) for a in s.arrays if not split(a)),
        sum(whole(a) for a in s.arrays if split(a)),
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
    expected = {
        'kind': 'all-gather + reduce-scatter' if plan.uses(FSDP) else 'all-reduce',
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
        shape = (s.rows, MLPConfig().layer_sizes[1]) if s.model == 'mlp' else s.activation
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
    return {
        'kind': 'collective-permute',
        'group_size': s.plan.devices,  # one ring per group of the other axes: a pair per device
        'ring_size': n,
        'count': ops * s.layers,  # unrolled layers (a scan's body holds one layer's)
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


def totals(records, twin: str = 'explicit') -> dict:
    """{(kind, axes, phase): bytes per step} of the records `twin` writes: what the tests
    compare with the compiled program's `program_totals`."""
    out = {}
    for r in records:
        r = r if isinstance(r, dict) else r.json()
        if twin in r['twins'] and r['total']:
            key = (r['kind'], tuple(r['axes']), r['phase'])
            out[key] = out.get(key, 0) + r['total']
    return out


def program_totals(ops) -> dict:
    """{(kind, axes, phase): bytes per step} of a compiled program's collectives, scalars (the
    metrics, the global norm's partial sums) left out: each operand's bytes x its op's trips."""
    out = {}
    for op in ops:
        sizes = [int(np.prod(s)) * _BYTES[d] for s, d in zip(op['shapes'], op['dtypes']) if len(s)]
        if sizes:
            key = (op['kind'], tuple(op['axes'] or ()), op['phase'])
            out[key] = out.get(key, 0) + sum(sizes) * op['trip_count']
    return out



def print_expected(r: dict) -> None:
    """The text of the expectation's records, one piece per axis, and per (kind, axes, phase)
    their bytes a step beside what the compiled explicit step moves."""
    records = r['expected']['collectives']
    print("\nExpected, one piece per mesh axis (inspector/expect.py):")
    print(f"{'piece':<9} {'kind':<18} {'axes':<10} {'phase':<12} {'bytes':>10} {'x trips':>7} "
          f"{'total':>12}  what")  # fmt: skip
    for e in records:
        print(
            f"{e['piece']:<9} {e['kind']:<18} {'/'.join(e['axes']):<10} {e['phase']:<12} "
            f"{e['bytes']:>10,} {'x' + str(e['trips']):>7} {e['total']:>12,}  {e['what']}"
            + ('' if 'auto' in e['twins'] else f" ({', '.join(e['twins'])} only)")
        )
    if 'explicit' not in r['programs']:
        return
    want, got = totals(records), program_totals(r['programs']['explicit'])
    print('explicit, bytes a step by kind, axes and phase (expected / compiled):')
    for key in sorted(set(want) | set(got), key=str):
        w, g = want.get(key, 0), got.get(key, 0)
        kind, axes, phase = key
        print(f"  {kind:<18} {'/'.join(axes) or '-':<10} {phase:<12} {w:>12,} / {g:>12,}"
              + ('' if w == g else '  differs'))  # fmt: skip
