"""The pipeline's schedules as tables: what each of the S stages does at each tick.

    gpipe        every microbatch forward, then every backward (`grad`'s: the same ticks in
                 reverse): M + S - 1 ticks each way, S - 1 of them a bubble per stage
    1f1b         after a warm-up, one forward and one backward unit per tick: a stage keeps at
                 most 2S - 1 microbatches' inputs, whatever M
    interleaved  1F1B with V chunks per stage (--pp_virtual): the bubble falls from
                 (S - 1)/(M + S - 1) to (S - 1)/(VM + S - 1)

Plain numpy, no JAX: the tick engine that runs a table is shard_parity/pipeline.py; the
pictures (docs/pipeline.md, benchmarks/pipeline.py) draw `cells`.
"""

from typing import NamedTuple

import numpy as np


class Ticks(NamedTuple):
    """A 1F1B schedule as data (`one_f_one_b`): what each of the S stages does at each tick.
    `forward` and `backward` map 'on', 'mb', 'chunk', 'slot' to int32 [ticks, S]: whether the
    stage runs a unit (one microbatch through one of its chunks) that tick, which microbatch,
    which of its V chunks, and where it keeps (forward) or finds (backward) that unit's input."""

    forward: dict
    backward: dict
    phases: tuple  # ticks of (the warm-up: forwards only, the steady state: both, the cool-down)
    slots: int  # K: the stage inputs a stage keeps at most, the `saved` buffer's length


def one_f_one_b(stages: int, microbatches: int, virtual: int = 1) -> Ticks:
    """1F1B in lockstep: at every tick each stage runs at most one forward unit and one backward
    unit, then hands its output to the next stage and its input's gradient to the previous one,
    which use them the next tick. With V chunks per stage (`virtual`, interleaved), chunk v of
    stage s is virtual stage vS + s (layers of chunk c: c L/(SV) .. (c+1) L/(SV) - 1), and a
    microbatch goes round the stages V times (the last stage's output back to stage 0).

    Stage s runs forward unit u = t - s at tick t: units in groups of S microbatches, each group
    through chunk 0, then chunk 1, ...: u = g SV + v S + w is microbatch g S + w in chunk v.
    Its backward unit is u = t - D - (S - 1 - s), D = VS - 1, the same order with the chunks
    reversed. Each unit's input then arrives exactly one tick before it runs, and the last
    chunk's backward runs at the tick of its forward (after the loss). In the first D ticks no
    backward can run and in the last D no forward: three phases, so that the bubble costs no
    compute that the formula does not count. Ticks: VM + S - 1 with a forward, as many with a
    backward, (S - 1)/(VM + S - 1) of each stage's units idle. A stage keeps each unit's input
    from its forward to its backward, at most 2VS - 1 (2(S - 1 - s) + 1 for V = 1): S-bound,
    whatever M (GPipe keeps all M + S - 1 ticks' activations)."""
    S, M, V = stages, microbatches, virtual
    depth, slots = V * S - 1, 2 * V * S - 1
    t, s = np.arange(V * M + V * S + S - 2)[:, None], np.arange(S)[None]

    def units(u, reverse):
        g, w = np.divmod(u, S * V)
        v = V - 1 - w // S if reverse else w // S
        on = (u >= 0) & (u < V * M)
        slot = (g * S * V + v * S + w % S) % slots  # the forward unit's index, round the buffer
        mb, chunk = np.where(on, g * S + w % S, 0), np.where(on, v, 0)
        fields = dict(on=on, mb=mb, chunk=chunk, slot=slot)
        return {k: a.astype(np.int32) for k, a in fields.items()}

    forward, backward = units(t - s, False), units(t - depth - (S - 1 - s), True)
    phases = (depth, V * M + S - 1 - depth, depth)
    assert not backward['on'][:depth].any() and not forward['on'][len(t) - depth :].any()
    return Ticks(forward, backward, phases, slots)


def gpipe_ticks(stages: int, microbatches: int) -> Ticks:
    """GPipe as the same table, for the pictures (`cells`): M + S - 1 forward ticks, then the
    backward's, which are `grad`'s: the same ticks in reverse."""
    S, M = stages, microbatches
    t, s = np.arange(2 * (M + S - 1))[:, None], np.arange(S)[None]
    f, b = t - s, 2 * (M + S - 1) - 1 - t - s

    def units(m):
        on = (m >= 0) & (m < M)
        return {'on': on, 'mb': np.where(on, m, 0), 'chunk': 0 * m, 'slot': 0 * m}

    return Ticks(units(f), units(b), (M + S - 1, 0, M + S - 1), M + S - 1)


def ticks(schedule: str, stages: int, microbatches: int, virtual: int = 1) -> Ticks:
    if schedule == 'gpipe':
        return gpipe_ticks(stages, microbatches)
    return one_f_one_b(stages, microbatches, virtual)


def cells(table: Ticks, virtual: int = 1) -> list[list[str]]:
    """Each tick's work per stage, drawn: 'F3' the forward of microbatch 3, 'B1' a backward,
    'F3:1' microbatch 3 in the stage's chunk 1 (interleaved), '·' the bubble."""

    def unit(kind, part, t, s):
        if not part['on'][t, s]:
            return ''
        chunk = f":{part['chunk'][t, s]}" if virtual > 1 else ''
        return f"{kind}{part['mb'][t, s]}{chunk}"

    f, b = table.forward, table.backward
    return [
        [' '.join(x for x in (unit('F', f, t, s), unit('B', b, t, s)) if x) or '·'
         for s in range(f['on'].shape[1])]
        for t in range(len(f['on']))
    ]  # fmt: skip


def sends(stages: int, virtual: int) -> list[tuple[int, int]]:
    """The (source, target) stages of a 1F1B hand-over: stage i to i + 1, and interleaved, the
    last stage to stage 0 (its output is the input of stage 0's next chunk). The gradients
    go the other way."""
    return [(i, (i + 1) % stages) for i in range(stages - (virtual == 1))]


def interleave_pairs(stages: int, virtual: int) -> dict:
    """Where interleaving moves each chunk: the blocks are placed L/S consecutive layers per
    stage (placement.py), chunks sV .. sV + V - 1 on stage s, and interleaved stage s runs
    chunks s, s + S, ...: {(j, v): [(source, target), ...]}, stage `source`'s chunk j becoming
    stage `target`'s chunk v (one ppermute each, in explicit/; their transposes bring the
    gradients back)."""
    S, V = stages, virtual
    pairs = {}
    for j in range(V):
        for v in range(V):
            moves = [(a, a * V + j - v * S) for a in range(S) if 0 <= a * V + j - v * S < S]
            if moves:
                pairs[j, v] = moves
    return pairs
