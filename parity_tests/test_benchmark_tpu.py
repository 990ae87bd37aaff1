"""`python -m benchmarks.run --platform=tpu`'s logic on the CPU (no chip here): its refusal without
a TPU, its chip sections (mfu at a tiny shape, chip_memory with a stand-in for memory_stats) and
the tables built from their rows, and the MFU every timed row now carries. The chip's own figures
are in benchmarks/results/tpu/results_tpu.json, from benchmarks/results/tpu/bench.sh."""

import dataclasses
import subprocess
import sys
import types

import jax
import pytest

from parity_tests.helpers import REPO
from shard_parity.runtime import flops


def benchmark(*flags):
    return subprocess.run(
        [sys.executable, '-m', 'benchmarks.run', *flags], cwd=REPO, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture(autouse=True, scope='module')
def _benchmark_flags():
    """benchmarks/options.py defines absl flags (--mesh among them) when a test here imports it
    in this process; the in-process inspector of other modules defines the train CLIs' --mesh
    (DuplicateFlagError in a shared xdist worker): the benchmark modules imported here, and
    their flags, go when this module's last test ends (as test_bisect_from does)."""
    from absl import flags

    before = set(sys.modules)
    yield
    for name in sorted(set(sys.modules) - before):
        if name.startswith('benchmarks'):
            for flag in flags.FLAGS.get_flags_for_module(name):
                delattr(flags.FLAGS, flag.name)
            sys.modules.pop(name, None)


def test_platform_tpu_without_a_tpu_is_one_line_and_exit_2():
    result = benchmark('--platform=tpu')
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        'error: --platform=tpu, but JAX finds no TPU (its devices: cpu; on a TPU host: pip '
        'install -e ".[tpu]")'
    ]


def test_the_chip_sections_are_refused_on_the_cpu():
    result = benchmark('--sections=twins,mfu,chip_memory')
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --sections has ['chip_memory', 'mfu'], which need a chip (GPT-2 small's step; "
        'memory_stats(), which XLA:CPU has not): give --platform=tpu or --platform=gpu'
    ]


def test_the_tpu_sections_default_and_order():
    """Without --sections, a TPU run takes chip_memory first (its peaks are read in a process
    whose peak only rises), then the twins, attention, nanogpt and mfu; with them, as given.
    In a child process: benchmarks/options.py's flags (--mesh, --target) share their names with
    the train and inspector CLIs', which other modules' tests define in this one."""
    code = (
        'import sys; from absl import flags; from benchmarks import TPU_SECTIONS, options; '
        'flags.FLAGS(sys.argv); print(options.sections(), TPU_SECTIONS)'
    )

    def sections(*argv):
        done = subprocess.run([sys.executable, '-c', code, *argv], cwd=REPO, capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip()

    tpu = ['chip_memory', 'twins', 'attention', 'nanogpt', 'mfu']
    assert sections('--platform=tpu') == f'{tpu} {tpu}'
    assert sections('--platform=tpu', '--sections=mfu').startswith("['mfu']")


TINY = dataclasses.replace(
    __import__('benchmarks.chip', fromlist=['GPT2_SMALL']).GPT2_SMALL,
    embed_dim=32, num_layers=2, num_heads=2, num_kv_heads=2, seq_len=16, dtype='float32',
)  # fmt: skip


def test_mfu_rows_count_the_model_flops_and_time_the_median(monkeypatch):
    """The mfu section at a tiny shape on the CPU: one row per twin, model FLOP/s = PaLM's count
    x tokens / the median step; no peak on the CPU, so MFU is None and the table says '-'."""
    from benchmarks import chip, tables

    rows = chip.mfu(3, TINY, batch_size=2)
    assert [r['twin'] for r in rows] == ['auto', 'explicit', 'typed']
    per_step = flops.per_unit('transformer', TINY) * 2 * 16
    for r in rows:
        assert r['model_flops_per_step'] == per_step
        assert r['model_tflops_per_sec'] == pytest.approx(per_step / (r['step_ms'] / 1e3) / 1e12)
        assert r['mfu'] is None and r['steps_timed'] == 3
        assert r['hardware_tflops_per_sec'] > 0  # XLA's count of the compiled step
    text = '\n'.join(chip.markdown({'mfu': rows}))
    assert '| auto |' in text and 'the median of 3 steps' in text
    assert tables.rate(rows[0]) == f"{rows[0]['model_tflops_per_sec']:.3g}"


def test_mfu_against_a_tpu_peak():
    """On a v5e in bf16 the same row's MFU is its FLOP/s over 197 TFLOP/s."""
    v5e = types.SimpleNamespace(platform='tpu', device_kind='TPU v5 lite')
    r = flops.rates(197e12 * 0.35, 1.0, v5e, 'bfloat16')
    assert r['mfu'] == pytest.approx(0.35) and r['model_tflops_per_sec'] == pytest.approx(68.95)
    assert flops.rates(1e12, 1.0, v5e, 'float32')['mfu'] is None  # no float32 peak
    from benchmarks import tables

    assert tables.rate({'auto_model_tflops_per_sec': 69.67, 'auto_mfu': 0.3537}, 'auto') == (
        '69.7 (35.4%)'
    )


def test_chip_memory_reads_the_peak_after_one_step():
    """chip_memory's logic with a stand-in for memory_stats (XLA:CPU keeps none): the compiler's
    figures of the one-device step, the peak after it, whether it rose, the difference."""
    from benchmarks import chip

    readings = iter([
        {'bytes_in_use': 0},
        {'bytes_in_use': 10, 'peak_bytes_in_use': 100},
        {'bytes_in_use': 10, 'peak_bytes_in_use': 5_000_000, 'bytes_limit': 9},
    ])  # fmt: skip
    rows = chip.chip_memory(['mlp'], stats=lambda: next(readings))
    (r,) = rows
    assert r['config'] == 'mlp' and r['inspector_flags'] == '--model=mlp'
    assert r['arguments'] > 0 and r['outputs'] > 0  # the MLP's state and batch; its new state
    assert r['peak'] == 5_000_000 and r['rose'] and r['in_use_before'] == 10
    assert r['difference'] == 5_000_000 - r['compiler_peak']
    text = '\n'.join(chip.markdown({'chip_memory': rows}))
    assert '| mlp |' in text and '4.8 |' in text


def test_measure_memory_without_memory_stats_is_refused():
    from shard_parity import UsageError
    from shard_parity.inspector.measured import one_device_peak

    with pytest.raises(UsageError, match='memory_stats'):
        one_device_peak('mlp', None, None, device=jax.devices()[0])


def test_one_chip_says_its_twins_have_no_collectives():
    from benchmarks import report

    machine = {'platform': 'tpu', 'devices': 1, 'device_kind': 'TPU v5 lite', 'cpu_count': 13,
               'jax': '0.10.2', 'libtpu': '0.0.42.1', 'date': 'd'}  # fmt: skip
    md = report.markdown({'machine': machine, 'command': 'c', 'twins': []})
    assert md.startswith('Machine: 1 tpu devices (TPU v5 lite) on 13 cores, jax 0.10.2, libtpu '
                         '0.0.42.1, d.')  # fmt: skip
    assert "One device: the twins' programs have no collectives here" in md
    cpu = report.markdown({'machine': machine | {'platform': 'cpu'}, 'command': 'c', 'twins': []})
    assert 'no collectives' not in cpu


def test_twins_rows_carry_each_candidates_rates():
    """Every timed row carries model TFLOP/s (and MFU where there is a peak): section 1's."""
    from benchmarks import sections

    rates = sections.flop_rates('mlp', None, 128, {'auto': 0.001, 'explicit': 0.002}, 8)
    per = flops.per_unit('mlp') * 128
    assert rates == {
        'auto_model_tflops_per_sec': per / 0.001 / 1e12, 'auto_mfu': None,
        'explicit_model_tflops_per_sec': per / 0.002 / 1e12, 'explicit_mfu': None,
    }  # fmt: skip


DRIVER = '''
import dataclasses, functools, sys
from absl import app
import benchmarks.chip as chip
from benchmarks import run
from shard_parity.runtime import declare_key_flags, parse_flags

run.check_platform = lambda asked, found: None  # the CPU stands in for the chip
chip.GPT2_SMALL = dataclasses.replace(chip.GPT2_SMALL, embed_dim=32, num_layers=2, num_heads=2,
                                      num_kv_heads=2, seq_len=16)
chip.GPT2_BATCH = 2
readings = iter([{'bytes_in_use': 0}, {'bytes_in_use': 1, 'peak_bytes_in_use': 2},
                 {'bytes_in_use': 1, 'peak_bytes_in_use': 3 * 2**20}])
chip.chip_memory = functools.partial(chip.chip_memory, ['mlp'], stats=lambda: next(readings))
declare_key_flags(run.KEY_FLAGS)
app.run(run.main, flags_parser=parse_flags)
'''


@pytest.mark.slow
def test_a_tpu_run_end_to_end_on_the_cpu(tmp_path):
    """`python -m benchmarks.run --platform=tpu` with the CPU standing in for the chip (its
    platform check off, GPT-2 small shrunk, memory_stats faked): the TPU sections run in their
    order, in-process, into results_tpu.{json,md}, and a second run of mfu alone merges into
    them, as benchmarks/tpu.sh runs them."""
    import json

    def tpu(*flags):
        return subprocess.run(
            [sys.executable, '-c', DRIVER, '--platform=tpu', f'--out={tmp_path}', *flags],
            cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip

    first = tpu('--sections=chip_memory,twins,nanogpt', '--rounds=1')
    assert first.returncode == 0, first.stderr[-3000:]
    ran = [ln for ln in first.stderr.splitlines() if ln.endswith('running ...')]
    assert ran == ['[chip_memory] running ...', '[twins] running ...', '[nanogpt] running ...']
    second = tpu('--sections=mfu', '--mfu_steps=2')
    assert second.returncode == 0, second.stderr[-3000:]
    results = json.loads((tmp_path / 'results_tpu.json').read_text())
    assert set(results) >= {'chip_memory', 'twins', 'nanogpt', 'mfu', 'merged'}
    assert results['machine']['transformer_dtype'] == 'bfloat16'
    (row,) = [r for r in results['twins'] if r['model'] == 'transformer']
    assert 'processes_ms' not in row  # section 1 ran once, in this process, not in children
    assert row['auto_model_tflops_per_sec'] > 0 and row['auto_mfu'] is None  # no CPU peak
    assert [r['twin'] for r in results['mfu']] == ['auto', 'explicit', 'typed']
    assert results['chip_memory'][0]['peak'] == 3 * 2**20
    md = (tmp_path / 'results_tpu.md').read_text()
    assert '**MFU: the GPT-2-small shape** (2 layers' in md and 'Section(s) mfu, rerun' in md
