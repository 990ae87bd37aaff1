"""Pipeline parallelism's bubble against M at fixed S, beside GPipe's (S - 1) / (M + S - 1), two
ways (docs/pipeline.md): from explicit/pp.py's compiled FLOPs, and from its step time; and each
schedule's (--pp_schedule: gpipe, 1f1b, interleaved) from its compiled FLOPs, beside
(S - 1) / (VM + S - 1).

    python -m benchmarks.pipeline [--plot=benchmarks/results/pipeline.png] [--rounds=7]
        [--trace=/tmp/schedules.json]

Schedules: explicit/pp.py and explicit/pp_1f1b.py's gradients (no update) at 32 layers minus
16 on data:1,stage:S, against the same schedule on one stage (data:1,stage:1, the same M
microbatches: no bubble), divided by S. 1F1B runs each backward again from the stage's saved
input (`jax.vjp`), so its FLOPs hold a second forward; the one-stage run holds it too, and the
ratio is the bubble alone. At least two layers per chunk: XLA removes a layer loop of one trip,
and the cost analysis then counts that layer's elementwise FLOPs otherwise than at two.
--trace writes the three schedules' ticks as Chrome trace-event JSON (Perfetto): one row per
stage, a forward or backward unit per tick.

Here the bubble ticks compute on zeros rather than idle, so both measure the bubble as the share
of the blocks' work that no emitted output needs. Both isolate the blocks as the difference
between 8 and 4 layers, which cancels the embedding, the head (run on every stage device) and
the update.
- FLOPs: deterministic (XLA's cost analysis, loop bodies counted per trip as the inspector counts
  them, inspector/program.py). The cost analysis counts a loop's elementwise FLOPs once, not per
  trip, so this bubble sits a little under the formula.
- Time: the train step on the mesh data:1,stage:S (--strategy=pp --mesh=1xS) against the same
  step with the same M microbatches on data:1,stage:1 (one stage, M ticks, no bubble),
  interleaved (benchmarks/timing.py): medians, and the extremes. The ideal pipelined step
  takes the one-stage step's time / P, P the stage devices that really compute at once: S on S
  accelerators; on emulated CPU devices, which share the host's cores, 1, for every thread is
  held to one core (--one_core), so that a bubble tick costs its zeros' compute. On the CPU
  that time also holds what the emulation adds: every collective-permute is a rendezvous of
  threads taking turns on that core (docs/pipeline.md shows how far that takes the figures
  from the FLOPs').
"""

import json
import math
import os

import jax
import numpy as np
from absl import app, flags
from flax import nnx

from benchmarks.plots import pipeline_plot
from shard_parity.devices import configure_jax

STAGES, MICROBATCHES, BATCH, LAYERS = 4, (1, 2, 4, 8, 16), 16, (4, 8)
PLOT = ONE_CORE = ROUNDS = TRACE = None  # the CLI's flags, defined when run as a program


def define_flags() -> None:
    """This CLI's flags, defined only when it runs (`python -m benchmarks.pipeline`): importing
    its functions (trace, schedule_bubbles) beside another CLI's --trace defines nothing."""
    global PLOT, ONE_CORE, ROUNDS, TRACE
    PLOT = flags.DEFINE_string('plot', None, 'Write the figure here (needs matplotlib).')
    ONE_CORE = flags.DEFINE_boolean(
        'one_core', True, 'On emulated CPU devices, run every thread on one core (Linux), so that '
        'no two devices compute at once and the time counts all their work.'
    )
    ROUNDS = flags.DEFINE_integer('rounds', 7, 'Timed rounds of each step, interleaved.', lower_bound=1)
    TRACE = flags.DEFINE_string(
        'trace', None, "Write each schedule's ticks per stage as Chrome trace JSON (Perfetto) here."
    )


SCHEDULE_M, SCHEDULE_LAYERS, VIRTUAL = (4, 8, 16), (16, 32), 2


def programs(step_for, tx):
    """`step_for(graphdef, state)` at 4 and at 8 layers (nanoGPT's width 128, T 64): a list of
    its two results, each (compiled program, the state placed for it, the batch)."""
    from shard_parity.model.transformer import Transformer
    from shard_parity import config as cfg
    from shard_parity.step import create_state

    out = []
    for layers in LAYERS:
        model = Transformer(cfg.TransformerConfig(num_layers=layers), rngs=nnx.Rngs(0))
        graphdef, state = create_state(model, tx)
        out.append(step_for(graphdef, state))
    return out


def block_flops(compiled) -> float:
    """FLOPs of 4 layers: 8 layers' program minus 4 layers'."""
    from shard_parity.inspector.hlo_module import Module
    from shard_parity.inspector.program import flops

    return float(np.subtract(*[flops(c, Module(c.as_text())) for c, *_ in compiled[::-1]]))


def block_seconds(timed: dict, rounds: int) -> dict:
    """`timed[key]`: [(compiled, state, batch)] at 4 and 8 layers, each run one at a time,
    interleaved (benchmarks/timing.py). {key: (median, lowest, highest)}: 8 layers' seconds minus
    4 layers' (the extremes: the fastest 8 less the slowest 4, and the reverse)."""
    from benchmarks.timing import interleaved

    def call(pair, i):
        def run():
            compiled, state, batch = pair[i]
            pair[i] = (compiled, jax.block_until_ready(compiled(state, batch))[0], batch)

        return run  # the step donates its state: the next call takes the new one

    t = interleaved({(k, i): call(p, i) for k, p in timed.items() for i in (0, 1)}, rounds)
    s = t['_spread']  # {(key, i): (min, max)}
    return {k: (t[k, 1] - t[k, 0], s[k, 1][0] - s[k, 0][1], s[k, 1][1] - s[k, 0][0]) for k in timed}


def measure(stages=STAGES, microbatches=MICROBATCHES, rounds=7, parallel=None) -> list[dict]:
    """`parallel`: how many stage devices compute at once (P above); by default S."""
    from shard_parity import explicit
    from shard_parity import plan as plans
    from shard_parity.mesh import mesh_for
    from shard_parity.placement import place_batch, place_state
    from shard_parity import config as cfg
    from shard_parity.runtime.tasks import lm_loss
    from shard_parity.step import make_optimizer, one_device_train_step

    tx = make_optimizer(cfg.TRAIN_DEFAULTS['transformer'])
    batch = {k: np.zeros((BATCH, 64), np.int32) for k in ('x', 'y')}

    def one(g, s):
        return one_device_train_step(g, lm_loss, tx).lower(s, batch).compile(), s, batch

    useful = block_flops(programs(one, tx)) / stages  # one stage's share of the whole batch's work
    parallel = parallel or stages

    def pp(s, m):
        plan = plans.parse(f'data:1,stage:{s}', None, s, microbatches=m)
        mesh = mesh_for(plan)

        def lower(g, state):
            state, placed = place_state(state, mesh, plan), place_batch(batch, mesh, plan)
            step = explicit.pp.train_step(g, lm_loss, tx, mesh, plan)
            return step.lower(state, placed).compile(), state, placed

        return programs(lower, tx)

    compiled = {(s, m): pp(s, m) for m in microbatches for s in (1, stages)}
    seconds = block_seconds(compiled, rounds)
    rows = []
    for m in microbatches:
        spent, ideal = seconds[stages, m], seconds[1, m][0] / parallel
        rows.append({
            'S': stages, 'M': m, 'formula': (stages - 1) / (m + stages - 1),
            'bubble': 1 - useful / block_flops(compiled[stages, m]),
            'time_bubble': 1 - ideal / spent[0],
            'time_range': (1 - ideal / spent[1], 1 - ideal / spent[2]),
            'ms': 1e3 * spent[0], 'ms_one_stage': 1e3 * seconds[1, m][0],
        })  # fmt: skip
    return rows


def gradient_flops(schedule, stages, microbatches, layers, virtual, shape, inside='data:1') -> float:
    """Per-device FLOPs of explicit's compiled gradients (pp.py for gpipe, else pp_1f1b.py) on
    `inside`,stage:S (the axes inside each stage: data:1, or fsdp:2,model:2 for the composed
    step), loop bodies counted per trip. `shape`: width, T and the global batch."""
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from shard_parity import explicit
    from shard_parity import plan as plans
    from shard_parity.inspector.hlo_module import Module
    from shard_parity.inspector.program import flops
    from shard_parity.memory import abstract_state
    from shard_parity.mesh import mesh_for
    from shard_parity.model.transformer import Transformer
    from shard_parity import config as cfg
    from shard_parity.runtime.tasks import lm_loss
    from shard_parity.step import make_optimizer, strategy_file

    width, seq, batch = shape
    text = f'{inside},stage:{stages}'
    devices = stages * math.prod(int(a.split(':')[1]) for a in inside.split(','))
    plan = plans.parse(text, None, devices, microbatches=microbatches, schedule=schedule,
                       virtual=virtual if schedule == 'interleaved' else None)  # fmt: skip
    mesh = mesh_for(plan)
    config = cfg.TransformerConfig(seq_len=seq, num_layers=layers, embed_dim=width)
    tx = make_optimizer(cfg.TRAIN_DEFAULTS['transformer'])
    graphdef, state = abstract_state(lambda r: Transformer(config, rngs=r), tx, mesh, plan)
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=NamedSharding(mesh, P()))
    fn = strategy_file(explicit, plan).loss_and_grads(graphdef, lm_loss, mesh, plan)
    compiled = fn.lower(state.params, {'x': tokens, 'y': tokens}).compile()
    return flops(compiled, Module(compiled.as_text()))


def schedule_bubbles(stages=STAGES, microbatches=SCHEDULE_M, layers=SCHEDULE_LAYERS,
                     virtual=VIRTUAL, shape=(128, 64, BATCH), inside='data:1') -> list[dict]:  # fmt: skip
    """Each schedule's bubble from its compiled FLOPs: the blocks' (`layers`[1] minus [0]) on
    S stages against S x theirs on one stage, beside (S - 1)/(VM + S - 1); `inside`: the other
    axes of the mesh, the same on both (gradient_flops)."""
    rows = []
    for schedule, v in (('gpipe', 1), ('1f1b', 1), ('interleaved', virtual)):
        for m in microbatches:
            blocks = {
                s: gradient_flops(schedule, s, m, layers[1], v, shape, inside)
                - gradient_flops(schedule, s, m, layers[0], v, shape, inside)
                for s in (1, stages)
            }  # fmt: skip
            rows.append({
                'schedule': schedule, 'S': stages, 'M': m, 'V': v,
                'formula': (stages - 1) / (v * m + stages - 1),
                'bubble': 1 - blocks[1] / (stages * blocks[stages]),
            })  # fmt: skip
    return rows


def trace(stages, microbatches, virtual) -> dict:
    """The three schedules' ticks as Chrome trace events: a process per schedule, a thread per
    stage, one event per forward or backward unit ('F3' microbatch 3, 'B3:1' its backward through
    the stage's chunk 1). A tick is drawn 1 ms wide, a forward and a backward in one tick side by
    side, each half of it."""
    from shard_parity.schedules import ticks

    events = []
    for pid, (schedule, v) in enumerate((('gpipe', 1), ('1f1b', 1), ('interleaved', virtual))):
        table = ticks(schedule, stages, microbatches, v)
        name = f'{schedule} S={stages} M={microbatches} V={v}'
        events.append({'ph': 'M', 'pid': pid, 'name': 'process_name', 'args': {'name': name}})
        for s in range(stages):
            events.append({'ph': 'M', 'pid': pid, 'tid': s, 'name': 'thread_name',
                           'args': {'name': f'stage {s}'}})  # fmt: skip
        for half, (kind, part) in enumerate((('F', table.forward), ('B', table.backward))):
            for t, s in zip(*np.nonzero(part['on'])):
                chunk = f":{part['chunk'][t, s]}" if v > 1 else ''
                events.append({'ph': 'X', 'pid': pid, 'tid': int(s), 'ts': 1000 * t + 500 * half,
                               'dur': 500, 'name': f"{kind}{part['mb'][t, s]}{chunk}",
                               'cat': 'forward' if kind == 'F' else 'backward'})  # fmt: skip
    return {'traceEvents': events, 'displayTimeUnit': 'ms'}


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
    configure_jax(8)
    cpu = jax.devices()[0].platform == 'cpu'  # emulated devices: as many at once as cores
    parallel = min(STAGES, os.cpu_count() or 1) if cpu else None  # None: S accelerators
    if cpu and ONE_CORE.value:
        if not hasattr(os, 'sched_setaffinity'):
            raise app.UsageError('--one_core holds threads to a core on Linux only: --noone_core')
        core, parallel = {min(os.sched_getaffinity(0))}, 1
        for thread in os.listdir('/proc/self/task'):  # XLA's threads too; new ones inherit it
            os.sched_setaffinity(int(thread), core)
    rows = measure(rounds=ROUNDS.value, parallel=parallel)
    print(f'{jax.devices()[0].device_kind}, jax {jax.__version__}, {ROUNDS.value} rounds; blocks '
          'only (8 layers minus 4); time: median [extremes]')  # fmt: skip
    for r in rows:
        lo, hi = r['time_range']
        print(f"S={r['S']} M={r['M']:2d}: formula {r['formula']:.3f}, FLOPs {r['bubble']:.3f}, "
              f"time {r['time_bubble']:.3f} [{lo:.3f}, {hi:.3f}] "
              f"({r['ms']:.1f} ms pipelined, {r['ms_one_stage']:.1f} ms on one stage)")  # fmt: skip
    schedules = schedule_bubbles()
    print(f'schedules, S={STAGES}: blocks only ({SCHEDULE_LAYERS[1]} layers minus '
          f'{SCHEDULE_LAYERS[0]}), compiled FLOPs against one stage')  # fmt: skip
    for r in schedules:
        print(f"{r['schedule']:>11} V={r['V']} M={r['M']:2d}: formula {r['formula']:.3f}, "
              f"FLOPs {r['bubble']:.3f}")  # fmt: skip
    if PLOT.value:
        pipeline_plot(rows, PLOT.value, schedules)
    if TRACE.value:
        with open(TRACE.value, 'w') as f:
            json.dump(trace(STAGES, STAGES, VIRTUAL), f)


if __name__ == '__main__':
    define_flags()
    app.run(main)
