"""The sections of `python -m benchmarks.run --platform=tpu` that need a chip: mfu (the GPT-2-small
shape in the three twins, each step's model FLOP/s against the device's peak) and chip_memory
(the one-device step's peak on the chip, measured, against its compiler's figure).

    python -m benchmarks.run --platform=tpu                       # or: bash benchmarks/tpu.sh OUT
    python -m benchmarks.run --platform=tpu --sections=mfu --mfu_steps=60

On one chip the twins' programs have no collectives: their agreement there says nothing about
parallelism, only that the three files compile to equally fast one-device programs.
"""

import dataclasses

import jax

from benchmarks.sections import TWINS, runner
from benchmarks.timing import interleaved
from shard_parity import config as cfg
from shard_parity.runtime import flops

# GPT-2 small's shape (124M parameters but for its 50,257-token vocabulary: this one is bytes)
GPT2_SMALL = cfg.TransformerConfig(
    embed_dim=768, num_layers=12, num_heads=12, num_kv_heads=12, seq_len=1024,
    dtype='bfloat16', attention='fused',
)  # fmt: skip
GPT2_BATCH = 16
# chip_memory's programs: the inspector's one-device step for each (model, train, model config),
# smallest first (a process's peak only rises: each then reads its own)
MEMORY_CONFIGS = {
    'mlp': ('mlp', {}, {}),
    'nanogpt_bf16': ('transformer', {}, {'dtype': 'bfloat16'}),
    'six_layers_bf16': (
        'transformer', {'batch_size': 64},
        {'dtype': 'bfloat16', 'num_layers': 6, 'embed_dim': 384, 'num_heads': 6,
         'num_kv_heads': 6, 'seq_len': 256},
    ),
}  # fmt: skip
INSPECTOR_FLAGS = {  # the same programs as `python -m inspector` flags (benchmarks/results/tpu)
    'mlp': '--model=mlp',
    'nanogpt_bf16': '--model=transformer --dtype=bfloat16',
    'six_layers_bf16': '--model=transformer --dtype=bfloat16 --num_layers=6 --embed_dim=384 '
    '--num_heads=6 --seq_len=256 --batch_size=64',
}


def mfu(rounds: int, model_config=None, batch_size: int | None = None) -> list[dict]:
    """One row per twin: the median step (one step per round, `rounds` rounds after two of
    warm-up, the twins interleaved), tokens/s, model TFLOP/s (PaLM's 6N + 12LDT a token,
    attention counted in full: runtime/flops.py), MFU against the device's peak in the compute
    dtype, and XLA's own count of the compiled step (hardware FLOPs: recomputation in, a loop
    body once). Default: GPT2_SMALL at GPT2_BATCH."""
    model_config, batch_size = model_config or GPT2_SMALL, batch_size or GPT2_BATCH
    runs = {
        twin.NAME: runner(twin, 1, 'transformer', batch_size, steps=1, model_config=model_config)
        for twin in TWINS
    }
    med = interleaved(runs, rounds)
    per_step = flops.per_unit('transformer', model_config) * batch_size * model_config.seq_len
    device = jax.devices()[0]
    rows = []
    for name, run in runs.items():
        step_s = med[name]
        hardware = run.hardware_flops()
        rows.append(
            {
                'twin': name, 'batch': batch_size, 'seq_len': model_config.seq_len,
                'layers': model_config.num_layers, 'embed_dim': model_config.embed_dim,
                'dtype': model_config.dtype, 'attention': model_config.attention,
                'steps_timed': rounds, 'step_ms': 1e3 * step_s,
                'tokens_per_sec': run.units / step_s, 'model_flops_per_step': per_step,
                **flops.rates(per_step, step_s, device, model_config.dtype),
                'hardware_tflops_per_sec': hardware / step_s / 1e12 if hardware else None,
            }
        )  # fmt: skip
    return rows


def memory_setting(name: str):
    """(model, TrainConfig, model config) of MEMORY_CONFIGS[name], as the inspector's flags make
    them (the model's training defaults, then the flags given)."""
    model, train, shape = MEMORY_CONFIGS[name]
    config = dataclasses.replace(cfg.TRAIN_DEFAULTS[model], **train)
    if model == 'mlp':
        return model, config, cfg.MLPConfig(**shape)
    return model, config, cfg.TransformerConfig(**shape)


def chip_memory(names=tuple(MEMORY_CONFIGS), stats=None) -> list[dict]:
    """One row per configuration: the one-device step compiled on this device, its compiler's
    figures, and the runtime's peak after one step (inspector/measured.py), in bytes. `stats`:
    a test's stand-in for the device's memory_stats."""
    from shard_parity.inspector.measured import one_device_peak

    rows = []
    for name in names:
        model, config, model_config = memory_setting(name)
        row = one_device_peak(model, config, model_config, stats=stats)
        rows.append({'config': name, 'inspector_flags': INSPECTOR_FLAGS[name], **row})
    return rows


def markdown(r: dict) -> list[str]:
    """The mfu and chip_memory tables (benchmarks/report.py)."""
    from benchmarks.tables import RATES, markdown_table, rate

    out = []
    if 'mfu' in r:
        x0 = r['mfu'][0]
        rows = [
            [x['twin'], f"{x['step_ms']:.2f}", f"{x['tokens_per_sec']:,.0f}", rate(x),
             f"{x['hardware_tflops_per_sec']:.3g}" if x['hardware_tflops_per_sec'] else '-']
            for x in r['mfu']
        ]  # fmt: skip
        out += [
            f"\n**MFU: the GPT-2-small shape** ({x0['layers']} layers, width {x0['embed_dim']}, "
            f"T = {x0['seq_len']}, batch {x0['batch']}, {x0['dtype']}, "
            f"{x0.get('attention', 'fused')} attention, one device; the median of "
            f"{x0['steps_timed']} steps after compilation, one a round, "
            f'the twins interleaved; {RATES}; XLA\'s cost analysis of the compiled step beside '
            'it: it counts the recomputed blocks, but a loop body (the scans) once)\n',
            markdown_table(
                ['twin', 'ms/step', 'tokens/s', 'model TFLOP/s (MFU)', 'XLA TFLOP/s'], rows
            ),
        ]
    if 'chip_memory' in r:
        mib = lambda b: f'{b / 2**20:,.1f}'  # noqa: E731
        rows = [
            [x['config'], mib(x['arguments']), mib(x['outputs']), mib(x['aliased']),
             mib(x['temp']), mib(x['compiler_peak']), mib(x['peak']) + ('' if x['rose'] else '*'),
             f"{x['difference'] / 2**20:+,.1f}"]
            for x in r['chip_memory']
        ]  # fmt: skip
        out += [
            '\n**The one-device step\'s memory on the chip** (MiB; the compiler\'s '
            "memory_analysis() of the executable compiled here, and the runtime's "
            'peak_bytes_in_use after one step (memory_stats()), the state made on the host; '
            '* not the step\'s own: the process had held more before it. Each config is `python '
            '-m inspector` with: '
            + '; '.join(f"{x['config']} `{x['inspector_flags']}`" for x in r['chip_memory'])
            + ')\n',
            markdown_table(
                ['config', 'arguments', 'outputs', 'aliased', 'temp', 'compiler peak',
                 'measured peak', 'measured - compiler'], rows
            ),
        ]  # fmt: skip
    return out
