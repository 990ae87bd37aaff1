"""Section remat: what each --remat_policy (shard_parity/model/transformer.py, docs/remat.md)
holds and costs: the compiled train step's temp memory (XLA's memory_analysis(), compile only)
and its median step time, per policy; and, on an accelerator, the largest batch each fits.

    python -m benchmarks.run --sections=remat --cpu_devices=8
    python -m benchmarks.remat --model=transformer --embed_dim=768 --num_layers=12 \\
        --num_heads=12 --seq_len=1024 --dtype=bfloat16 --attention=fused --out=remat.json

The section: nanoGPT's configuration, global batch 16, the auto twin under dp on one device and
under fsdp on every device (up to 8), each policy and unset timed interleaved
(benchmarks.timing).
The module's own CLI (benchmarks/results/tpu/remat.sh runs it on the chip): the transformer the
model flags give, the auto twin on one device. Per policy it compiles the step at
--fit_start's batches, reads each program's bytes (the TPU compiler's peak where it gives one,
else arguments + temp + outputs - aliased), draws the line through them to the batch where the
device's memory (--hbm_gib, default the device's own bytes_limit) runs out, and compiles the
batches around it until one fits and the next does not (or is refused: RESOURCE_EXHAUSTED).
Compiles run in threads (--compile_workers; XLA's compile leaves Python's lock), lowering in
the main thread; --timed_steps steps of each policy at --batch_size are timed between the first
round and the rest, on the executables compiled at that batch.
--target=tpu-v5e-1 (inspector/target.py; libtpu): the same search on a machine without the chip,
each step compiled from shapes by the TPU compiler for that target's devices, the budget its HBM
(the one chip's bytes_limit, remat_r1.json: --hbm_gib=15.748046875, 512 bytes above it); nothing
is timed. A TPU program's memory is fixed when it compiles: at batches 16 and 32 these compiles
gave the chip's own figures to the byte (docs/remat.md). On a TPU a step fits when its compiler
accepts it and its peak is within the budget. --policies: the ones searched.
"""

import concurrent.futures
import dataclasses
import json
import math
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from benchmarks.sections import NANOGPT, per_step, runner, setup
from benchmarks.timing import interleaved
from shard_parity import auto, memory, refuse
from shard_parity import config as cfg
from shard_parity import plan as plans
from shard_parity.inspector import target as targets
from shard_parity.inspector.target_figures import does_not_fit
from shard_parity.mesh import mesh_for
from shard_parity.model.transformer import REMAT_POLICIES, Transformer
from shard_parity.placement import place_batch, place_state, rows
from shard_parity.runtime import flops, tasks
from shard_parity.step import make_optimizer, strategy_file

POLICIES = list(REMAT_POLICIES)
BATCH_SIZE = 16
GiB = 2**30


def lowered(policy: str, model_config, batch_size: int, plan, devices=None):
    """The auto twin's train step of `model_config` under `policy`, lowered for `batch_size`
    rows on `plan`'s mesh (abstract state: nothing is made), over `devices` (a --target's
    compile-only ones; default this process's)."""
    mc = dataclasses.replace(model_config, remat_policy=policy)
    mesh = mesh_for(plan, auto.AXIS_TYPE, devices=devices)
    sharding = NamedSharding(mesh, rows(plan))
    shape = (batch_size, mc.seq_len)
    batch = {k: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding) for k in ('x', 'y')}
    tx = make_optimizer(cfg.TRAIN_DEFAULTS['transformer'])
    graphdef, state = memory.abstract_state(lambda r: Transformer(mc, rngs=r), tx, mesh, plan)
    module = strategy_file(auto, plan)
    return module.train_step(graphdef, tasks.lm_loss, tx, mesh, plan).lower(state, batch)


def footprint(compiled, tpu: bool = False) -> dict:
    """MiB of a compiled step: memory.measured's arguments, temp and peak, the compiler's own
    peak where it reports one, and `bytes`, what must fit: on a TPU (`tpu`) the compiler's
    peak, the HBM it laid the program out in (it accepts steps whose temp alone is above the
    HBM: GPT-2-small, full, batch 244: temp 17.26 GiB, peak 12.53), else the larger peak."""
    out = memory.measured(compiled)
    own = getattr(compiled.memory_analysis(), 'peak_memory_in_bytes', 0) or 0
    out['compiler_peak'] = own / memory.MiB
    out['bytes'] = own if tpu else max(out['peak'], out['compiler_peak']) * memory.MiB
    return out


def compile_or_refusal(low, tpu: bool = False) -> tuple:
    """(compiled, footprint) or (None, {'does_not_fit': the compiler's reason})."""
    try:
        compiled = low.compile()
    except Exception as e:  # noqa: BLE001  RESOURCE_EXHAUSTED: the chip cannot hold it
        if (why := does_not_fit(e)) is None:  # another failure: kept, counted as not fitting
            return None, {'does_not_fit': f'failed: {type(e).__name__}: {str(e)[:300]}'}
        return None, {'does_not_fit': why}
    return compiled, footprint(compiled, tpu)


def next_batches(seen: dict, budget: float) -> list[int]:
    """The batches to compile next for one policy, given `seen` {batch: footprint}: none once
    the largest that fits is one below the smallest that does not; else the line through the
    two largest measured batches, where it crosses `budget` bytes, and the batch after it,
    where that is strictly between the two; else (a TPU compiler that squeezes a step near
    its HBM bends the line) the batch halfway; doubling or halving while there is no line."""
    fits = [b for b, f in seen.items() if f.get('bytes', math.inf) <= budget]
    lo = max(fits, default=0)
    hi = min((b for b in seen if b > lo and b not in fits), default=math.inf)
    if hi == lo + 1:
        return []
    measured = sorted(b for b, f in seen.items() if 'bytes' in f)[-2:]
    if len(measured) < 2:
        return [lo * 2] if hi == math.inf else [max(lo + 1, (lo + hi) // 2)]
    (b1, b2), (m1, m2) = measured, [seen[b]['bytes'] for b in measured]
    slope = (m2 - m1) / (b2 - b1)
    guess = math.floor(b1 + (budget - m1) / slope) if slope > 0 else lo * 2
    if hi == math.inf:
        return sorted({max(guess, lo + 1), max(guess, lo + 1) + 1} - set(seen))
    if not lo + 1 < guess < hi - 1:
        return [(lo + hi) // 2]
    return sorted({guess, guess + 1} - set(seen))


def largest(seen: dict, budget: float) -> dict:
    """The largest batch that fits, and the smallest known not to (None while not found)."""
    fits = [b for b, f in seen.items() if f.get('bytes', math.inf) <= budget]
    lo = max(fits, default=0)
    hi = min((b for b in seen if b > lo and b not in fits), default=None)
    return {'largest_fitting': lo or None, 'smallest_not': hi, 'exact': hi == lo + 1}


def timed(compiled, host, plan, steps: int) -> dict:
    """Median seconds of `steps` runs of `compiled` (each waited on) after 2 untimed, on
    `host` = setup()'s (state, batch, units, model_config); its tokens/s and MFU
    (runtime/flops.py's model count)."""
    mesh = mesh_for(plan, auto.AXIS_TYPE)
    state, batch, units, model_config = host
    state, batch = place_state(state, mesh, plan), place_batch(batch, mesh, plan)
    laps = []
    for _ in range(steps + 2):
        start = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready((state, metrics))
        laps.append(time.perf_counter() - start)
    step_s = statistics.median(laps[2:])
    per = flops.per_unit('transformer', model_config)
    return {
        'step_s_median': step_s,
        'tokens_per_sec': units / step_s,
        'loss': float(np.asarray(metrics['loss'])),
        **flops.rates(per * units, step_s, jax.devices()[0], model_config.dtype),
    }


def fit(model_config, budget: float, start, batch_size: int, steps: int, workers: int,
        deadline: float, policies: dict, report=print, known=None, devices=None) -> dict:  # fmt: skip
    """Per policy (`policies`: name -> remat_policy): the largest batch whose step fits
    `budget` bytes, every compile's footprint, and the timing at `batch_size` (none with
    `steps` 0). Starts no round of compiles that the last round's length would take past
    `deadline` (time.monotonic()), and reports what it has. `known`: {name: {batch:
    footprint}} of an earlier run, where the search goes on from (no `start`). `devices`: a
    --target's, compiled for from shapes (then `steps` must be 0: nothing can run)."""
    plan = plans.parse(None, 'dp', 1)
    tpu = (devices or jax.devices())[0].platform == 'tpu'
    seen = {p: {b: dict(f) for b, f in (known or {}).get(p, {}).items()} for p in policies}
    for f in (f for s in seen.values() for f in s.values() if tpu and 'compiler_peak' in f):
        f['bytes'] = f['compiler_peak'] * memory.MiB  # an earlier run's, held alike
    out = {p: {'remat_policy': v, 'compiles': seen[p]} for p, v in policies.items()}
    first = sorted(set(start) | ({batch_size} if steps else set()))
    todo = {p: next_batches(seen[p], budget) if seen[p] else first for p in policies}
    at_batch, last = {}, 0.0
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        while any(todo.values()) and time.monotonic() + last < deadline:
            began = time.monotonic()
            jobs = {(p, b): pool.submit(compile_or_refusal,
                                        lowered(policies[p], model_config, b, plan, devices), tpu)
                    for p, batches in todo.items() for b in batches}  # fmt: skip
            for (p, b), job in jobs.items():
                compiled, seen[p][b] = job.result()
                report(f'{p} batch {b}: {json.dumps(seen[p][b])}')
                if steps and b == batch_size and compiled is not None and not last:
                    at_batch[p] = compiled
            last = time.monotonic() - began
            if at_batch:  # the step times, after the first round, before the rest
                _, _, state, _, batch, units = setup('transformer', batch_size, model_config)
                host = (state, batch, units, model_config)
                for p, compiled in at_batch.items():
                    try:  # one policy's failure (a runtime out-of-memory) leaves the others
                        out[p]['timed'] = timed(compiled, host, plan, steps)
                    except Exception as e:  # noqa: BLE001
                        out[p]['timed'] = {'failed': f'{type(e).__name__}: {str(e)[:300]}'}
                    out[p]['timed']['batch'] = batch_size
                    report(f"{p} timed: {json.dumps(out[p]['timed'])}")
                at_batch = {}
            todo = {p: next_batches(seen[p], budget) for p in policies}
            for p in policies:
                out[p] |= largest(seen[p], budget)
            report(out)  # each round's state: what a run stopped later still has
    return out


def remat_section(rounds: int, model_config=NANOGPT, batch_size=BATCH_SIZE) -> list[dict]:
    """One row per strategy x policy (and `unset`, each path as before the flag: under dp the
    unrolled layers): the compiled step's temp and peak (MiB per device), its median step time
    (the policies timed interleaved, per strategy)."""
    n = min(8, jax.device_count())
    rows_out = []
    for strategy, count in (('dp', 1), ('fsdp', n)):
        plan = plans.parse(None, strategy, count)
        runs = {}
        for p in [*POLICIES, None]:
            name = p or 'unset'
            mc = dataclasses.replace(model_config, remat_policy=p)
            mem = footprint(lowered(p, model_config, batch_size, plan).compile())
            rows_out.append({'strategy': strategy, 'devices': count, 'policy': name, **mem})
            runs[name] = runner(auto, count, 'transformer', batch_size, model_config=mc,
                                strategy=strategy)  # fmt: skip
        t = per_step(interleaved(runs, rounds), runs)
        for r in rows_out[-len(runs) :]:
            r['step_ms'] = 1e3 * t[r['policy']]
    return rows_out


def markdown(rows_out: list[dict], config=NANOGPT) -> list[str]:
    out = [
        (
            '\n## Remat policies: the compiled train step per --remat_policy (XLA '
            'memory_analysis, MiB per device; step time)\n'
        ),
        (
            f'The auto twin, transformer of width {config.embed_dim}, {config.num_layers} '
            f'layers, seq_len {config.seq_len}, global batch {BATCH_SIZE}; unset: as before '
            'the flag (dp: the unrolled layers; fsdp: full); docs/remat.md.\n'
        ),
        '| strategy | devices | policy | temp | peak | step ms |',
        '| --- | ---: | --- | ---: | ---: | ---: |',
    ]
    for r in rows_out:
        out.append(
            f"| {r['strategy']} | {r['devices']} | {r['policy']} | {r['temp']:.1f} | "
            f"{r['peak']:.1f} | {r['step_ms']:.2f} |"
        )
    return out


def main(argv):  # python -m benchmarks.remat: the module docstring
    from absl import flags

    from shard_parity.devices import configure_jax
    from shard_parity.runtime import from_flags

    F = flags.FLAGS
    configure_jax(F.cpu_devices, cpu_fma=F.cpu_fma, libtpu_lines=F.verbose)
    model_config = from_flags.transformer_config()
    devices, chip, steps = on_target(F)
    limit = None if chip else (jax.devices()[0].memory_stats() or {}).get('bytes_limit')
    budget = F.hbm_gib * GiB if F.hbm_gib else (chip.hbm_bytes if chip else limit or 15.75 * GiB)
    start = [int(b) for b in F.fit_start]
    deadline = time.monotonic() + F.deadline_s
    info = {'device': chip.device_kind if chip else jax.devices()[0].device_kind,
            'jax': jax.__version__, 'budget_bytes': budget, 'device_bytes_limit': limit,
            'model_config': dataclasses.asdict(model_config)}  # fmt: skip
    if chip:  # compiled here from shapes by the target's compiler, which holds them to its HBM
        info |= {'target': chip.name, 'target_hbm_bytes': chip.hbm_bytes}

    def report(what):  # a line to stderr; the results so far to --out
        if isinstance(what, str):
            print(what, file=sys.stderr, flush=True)
        elif F.out:
            with open(F.out, 'w') as f:
                f.write(json.dumps(info | {'policies': what}, indent=1, default=str))

    policies = {p: p for p in F.policies} | ({'default': None} if F.with_default else {})
    known = None
    if F.fit_known:  # {policy: {batch: footprint}}, from an earlier run's --out
        with open(F.fit_known) as f:
            earlier = json.load(f)['policies']
        known = {p: {int(b): v for b, v in r['compiles'].items()} for p, r in earlier.items()}
    with targets.uncached(chip is not None):
        found = fit(model_config, budget, start, from_flags.batch_size(), steps,
                    F.compile_workers, deadline, policies, report, known, devices)  # fmt: skip
    report(found)
    for p, r in found.items():
        t = r.get('timed', {})
        print(f"{p}: largest batch {r['largest_fitting']} (next {r['smallest_not']}, exact "
              f"{r['exact']}); batch {t.get('batch')}: step {t.get('step_s_median')} s, "
              f"{t.get('tokens_per_sec')} tokens/s, mfu {t.get('mfu')}")  # fmt: skip


def on_target(F) -> tuple:
    """(devices, Target, timed steps) of --target: its compile-only devices, nothing timed;
    (None, None, --timed_steps) without one. Bad input (a target's timed steps, one this
    machine cannot compile for: no libtpu) is one line, exit 2."""
    if not F.target:
        return None, None, F.timed_steps
    if F['timed_steps'].present and F.timed_steps:
        refuse(f'--timed_steps={F.timed_steps} with --target={F.target}: the target\'s devices '
               'run nothing; drop --timed_steps or give 0')  # fmt: skip
    try:
        return targets.devices(F.target, F.verbose), targets.get(F.target), 0
    except targets.TargetError as e:
        refuse(str(e))


def define_flags():
    from absl import flags

    flags.DEFINE_list('fit_start', ['16', '32'], 'The first batches compiled per policy.')
    flags.DEFINE_multi_enum('policies', POLICIES, POLICIES, 'The policies searched (and timed).')
    flags.DEFINE_integer('timed_steps', 30, 'Steps timed per policy at --batch_size (0: none).')
    flags.DEFINE_integer('compile_workers', 8, 'Compiles at once (threads).')
    flags.DEFINE_float('deadline_s', 300, 'Start no round of compiles that would end later.')
    flags.DEFINE_bool('with_default', True, 'Also the unset policy (as before the flag).')
    flags.DEFINE_float(
        'hbm_gib',
        None,
        "Device memory (default: the device's bytes_limit; "
        "with --target, the HBM its compiler holds a program to).",
    )
    flags.DEFINE_enum(
        'target',
        None,
        list(targets.TARGETS),
        'Compile for this hardware from shapes, here (inspector/target.py; tpu-*: '
        'pip install -e ".[tpu]"): the fit search only, nothing timed.',
    )
    flags.DEFINE_string('out', None, 'Write the results as JSON here.')
    flags.DEFINE_string('fit_known', None, "An earlier --out's compiles to search on from.")


if __name__ == '__main__':
    from absl import app

    from shard_parity.runtime import declare_key_flags, from_flags, parse_flags  # noqa: F401

    define_flags()
    declare_key_flags([])  # --help exits 0; a bad flag is one line, exit 2 (parse_flags)
    app.run(main, flags_parser=parse_flags)
