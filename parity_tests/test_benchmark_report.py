"""benchmarks.report: section 1 as the benchmark writes it, from one process or several, with or
without the auto copy control (results from before it existed still render)."""

import json
import pathlib
import re

import pytest

from benchmarks import plots, report
from parity_tests.helpers import REPO

MACHINE = {'platform': 'cpu', 'device_kind': 'cpu', 'devices': 8, 'cpu_count': 2, 'jax': 'x'}
MACHINE |= {'date': 'today'}


def row(model, ratio, copy_ratio, auto_ms=10.0):
    return {
        'model': model,
        'batch': 16,
        'devices': 8,
        'reference_ms': 5.0,
        'auto_ms': auto_ms,
        'explicit_ms': auto_ms * ratio,
        'auto_copy_ms': auto_ms * copy_ratio,
        'explicit_over_auto': ratio,
        'auto_copy_over_auto': copy_ratio,
    }


def section_1(rows) -> list[str]:
    text = report.markdown({'machine': MACHINE, 'command': 'c', 'twins': rows})
    return [line for line in text.splitlines() if line.startswith('| ')]


def test_several_processes_give_each_ratio_as_its_own_median_and_range():
    """Ratios of 3 processes (explicit/auto, auto copy/auto): (0.90, 1.00), (1.00, 0.95) and
    (0.97, 1.10). The step times are the median process's, the third; the control's median is
    1.00, not that process's 1.10."""
    processes = [row('t', 0.90, 1.00), row('t', 1.00, 0.95), row('t', 0.97, 1.10)]
    median = dict(processes[2])
    median['explicit_over_auto_runs'] = [p['explicit_over_auto'] for p in processes]
    median['auto_copy_over_auto_runs'] = [p['auto_copy_over_auto'] for p in processes]
    header, _, line = section_1([median])
    assert 'auto copy/auto' in header
    assert line.endswith('| 9.70 | 11.00 | 0.970 (0.900–1.000) | 1.000 (0.950–1.100) |')


def test_one_process_gives_the_ratios_alone():
    header, _, line = section_1([row('t', 0.97, 1.01)])
    assert line.endswith('| 9.70 | 10.10 | 0.970 | 1.010 |')


def test_results_from_before_the_control_render_without_it():
    old = json.loads((pathlib.Path(REPO) / 'benchmarks/results/gpu/results_gpu.json').read_text())
    assert 'auto_copy_ms' not in old['twins'][0]
    header, *_ = section_1(old['twins'])
    assert 'auto copy' not in header and header.endswith('| explicit/auto |')


def test_the_per_process_plot_takes_a_single_model(tmp_path):
    pytest.importorskip('matplotlib')
    x = row('mlp', 1.0, 1.0) | {'processes_ms': [{'auto_ms': 1.0, 'explicit_ms': 1.1}] * 3}
    plots.plots({'twins': [x]}, tmp_path)
    assert (tmp_path / 'twins.png').stat().st_size > 0


def test_typed_gets_its_column_and_ratio_beside_explicit():
    x = row('t', 0.97, 1.01) | {'typed_ms': 9.9, 'typed_over_auto': 0.99}
    header, _, line = section_1([x])
    assert header.endswith(
        '| explicit | typed | auto copy | explicit/auto | typed/auto | auto copy/auto |'
    )
    assert line.endswith('| 9.70 | 9.90 | 10.10 | 0.970 | 0.990 | 1.010 |')
    x['typed_over_auto_runs'] = [1.02, 0.99, 0.95]  # several processes: median and range
    x['explicit_over_auto_runs'] = [0.97] * 3
    text = report.markdown({'machine': MACHINE, 'command': 'c', 'twins': [x]})
    assert '| 0.990 (0.950–1.020) |' in text and '- t, typed/auto: 1.020, 0.990, 0.950' in text


def test_the_cli_section_gives_tokens_per_sec_and_time_ratios():
    x = {'batch': 32, 'steps': 300, 'devices': 8, 'rounds': 2}
    for name, rate in (('auto', 6000), ('explicit', 5000), ('typed', 6000), ('auto_copy', 6100)):
        x[f'{name}_tokens_per_sec'] = rate
    for name, runs in (('explicit', [1.1, 1.3]), ('typed', [1.0, 1.0]), ('auto_copy', [1.0, 0.9])):
        x[f'{name}_over_auto'], x[f'{name}_over_auto_runs'] = sum(runs) / 2, runs
    text = report.markdown({'machine': MACHINE, 'command': 'c', 'cli': [x]})
    (line,) = [t for t in text.splitlines() if t.startswith('| 32 |')]
    assert line == (
        '| 32 | 300 | 6,000 | 5,000 | 6,000 | 6,100 | 1.100 (1.100–1.300) | 1.000 (1.000–1.000) '
        '| 0.900 (0.900–1.000) |'
    )


RECORDED = pathlib.Path(REPO) / 'benchmarks/results/results.json'


def test_a_run_of_some_sections_merges_into_the_recorded_results():
    """A single-section run never replaces the full suite's figures: its section replaces the
    recorded one, the others stay, and the header says which run each came from; a run of
    every recorded section replaces the file."""
    from benchmarks import SECTIONS, output

    recorded = json.loads(RECORDED.read_text())
    assert set(output.sections_of(recorded, SECTIONS)) > {'nanogpt'}  # the full suite's
    machine = recorded['machine'] | {'date': 'later'}
    run = {'machine': machine, 'command': 'python -m benchmarks.run --sections=nanogpt',
           'nanogpt': recorded['nanogpt'] | {'step_ms': 1.0}}  # fmt: skip
    merged, kept = output.merge(recorded, run, SECTIONS)
    assert merged['nanogpt']['step_ms'] == 1.0 and merged['twins'] == recorded['twins']
    assert kept == [s for s in output.sections_of(recorded, SECTIONS) if s != 'nanogpt']
    text = report.markdown(merged)
    assert text.startswith(f"Machine: 8 cpu devices (cpu) on 2 cores, jax {machine['jax']}")
    assert "Section(s) nanogpt, rerun: Machine: 8 cpu devices (cpu) on 2 cores, jax" in text
    assert '`python -m benchmarks.run --sections=nanogpt`' in text
    again, _ = output.merge(merged, run | {'command': 'twice', 'nanogpt': {}}, SECTIONS)
    earlier = [n['command'] for n in recorded.get('merged', []) if set(n['sections']) - {'nanogpt'}]
    # the first note lost its section; the recorded file's own notes of other sections stay
    assert [n['command'] for n in again['merged']] == [*earlier, 'twice']
    full = {'machine': machine, 'command': 'all', **{s: recorded[s] for s in kept + ['nanogpt']}}
    assert output.merge(recorded, full, SECTIONS) == (full, [])


def test_a_target_runs_header_names_the_target():
    m = MACHINE | {'target': 'tpu-v5e-8', 'target_device_kind': 'TPU v5 lite', 'target_devices': 8}
    first = report.markdown({'machine': m, 'command': 'c', 'memory': []}).splitlines()[0]
    assert first.startswith('Compiled for tpu-v5e-8 (8 TPU v5 lite devices) from shapes alone')
    assert 'cpu devices' not in first


def test_outputs_are_refused_before_a_section_runs(tmp_path):
    from benchmarks import output
    from shard_parity import UsageError

    (tmp_path / 'afile').write_text('x')
    (tmp_path / 'taken' / 'results.json').mkdir(parents=True)
    (tmp_path / 'torn').mkdir()
    (tmp_path / 'torn' / 'results.json').write_text('{"machine": ')
    for out, message in (
        (tmp_path / 'afile', 'afile is a file, not a folder'),
        (tmp_path / 'afile' / 'deeper', 'afile is a file, not a folder'),
        ('/sys/results', '--out=/sys/results: cannot write in /sys'),
        (tmp_path / 'taken', 'results.json is a folder, where the results file goes'),
        (tmp_path / 'torn', 'results.json is not a results file of this benchmark'),
    ):
        with pytest.raises(UsageError, match=re.escape(message)):
            output.check(str(out), True, '', None)
    fresh = output.check(str(tmp_path / 'new' / 'folder'), True, '', None)
    assert fresh.recorded is None and not (tmp_path / 'new').exists()  # made only to write
    assert output.check('benchmarks/results', False, '_tpu-v5e-8', 'tpu-v5e-8').folder is None
    assert output.check(str(tmp_path), True, '_tpu-v5e-8', 'tpu-v5e-8').folder == tmp_path
