"""`python -m tools.compare A B`: it agrees when the runs agree, for both models' logs, and
says why when they do not."""

import json
import math
import subprocess
import sys

import pytest

from parity_tests.helpers import REPO


def workdir(tmp_path, name, lines):
    path = tmp_path / name
    path.mkdir()
    (path / 'metrics.jsonl').write_text(''.join(json.dumps(x) + '\n' for x in lines))
    return path


def compare(*args):
    cmd = [sys.executable, '-m', 'tools.compare', *map(str, args)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)


def transformer_log(final_loss):  # the transformer logs losses and no accuracy
    return [
        {'step': 100, 'train_loss': 2.5},
        {'step': 100, 'eval_loss': 2.4, 'eval_perplexity': 11.0},
        {'step': 100, 'final': True, 'eval_loss': final_loss, 'tokens_per_sec': 1e4},
    ]


def test_equal_transformer_runs_agree(tmp_path):
    a = workdir(tmp_path, 'a', transformer_log(2.4))
    b = workdir(tmp_path, 'b', transformer_log(2.4))
    done = compare(a, b)
    assert done.returncode == 0, done.stderr
    assert 'final eval_loss 2.4000 vs 2.4000' in done.stdout and 'bitwise identical' in done.stdout


def test_transformer_runs_apart_by_more_than_max_loss_gap_fail(tmp_path):
    a = workdir(tmp_path, 'a', transformer_log(2.4))
    b = workdir(tmp_path, 'b', transformer_log(2.5))
    done = compare(a, b)
    assert done.returncode == 1  # they disagree (2 would be a refused input)
    assert 'final eval_loss values differ by 0.1000 > --max_loss_gap=0.01' in done.stderr
    assert compare(a, b, '--max_loss_gap=0.2').returncode == 0


MLP_FINAL = {'step': 10, 'final': True, 'eval_loss': 0.2, 'eval_accuracy': 0.95}


def test_mlp_runs_are_judged_on_their_accuracy_alone(tmp_path):
    a = workdir(tmp_path, 'a', [{'step': 10, 'train_loss': 0.3}, MLP_FINAL])
    b = workdir(tmp_path, 'b', [{'step': 10, 'train_loss': 0.3}, {**MLP_FINAL, 'eval_loss': 0.5}])
    c = workdir(
        tmp_path, 'c', [{'step': 10, 'train_loss': 0.3}, {**MLP_FINAL, 'eval_accuracy': 0.9}]
    )
    assert compare(a, b).returncode == 0  # losses 0.3 apart, the same accuracy: they agree
    done = compare(a, c)
    assert done.returncode == 1
    assert 'final eval_accuracy values differ by 0.0500 > --max_accuracy_gap=0.003' in done.stderr


def test_an_mlp_run_beside_a_transformer_run_is_refused(tmp_path):
    a = workdir(tmp_path, 'a', [MLP_FINAL])
    b = workdir(tmp_path, 'b', transformer_log(0.2))
    for pair in ((a, b), (b, a)):
        done = compare(*pair)
        assert done.returncode == 2 and 'only one of' in done.stderr, done.stderr


def test_an_empty_log_is_named(tmp_path):
    a = workdir(tmp_path, 'a', transformer_log(2.4))
    b = workdir(tmp_path, 'b', [])
    done = compare(a, b)
    assert done.returncode == 2  # not a run that can be compared: refused input
    assert f'{b / "metrics.jsonl"} is empty' in done.stderr


def one_error_line(done):
    """The run failed with a single `error: ...` line on stderr and no traceback."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert lines[0].startswith('error: '), done.stderr
    return lines[0]


def mlp_log(log_every, eval_loss=0.5):
    """An MLP run of 200 steps: train lines every `log_every` steps, each the mean loss since
    the previous one, and an eval line every 100 steps."""
    lines = []
    for step in range(log_every, 201, log_every):
        lines.append({'step': step, 'train_loss': (2.0 - step / 200) + 0.01 * log_every})
        if step % 100 == 0:
            lines.append({'step': step, 'eval_loss': eval_loss, 'eval_accuracy': 0.9})
    lines.append({'step': 200, 'final': True, 'eval_loss': eval_loss, 'eval_accuracy': 0.9})
    return lines


def test_lines_are_paired_by_step_not_by_position(tmp_path):
    a = workdir(tmp_path, 'a', mlp_log(10))  # the same run, logged twice as often
    b = workdir(tmp_path, 'b', mlp_log(20))
    done = compare(a, b)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[1:] if line[:6].strip().isdigit()]
    steps = {int(r[0]) for r in rows}
    assert steps == set(range(20, 201, 20))  # only the steps both logged, each beside itself
    assert all(r[1] != 'eval_loss' or r[2] == r[3] for r in rows)
    # Its train means cover 10 steps in a, 20 in b: shown, marked, not called a disagreement.
    assert all(r[-1] == '*' for r in rows if r[1] == 'train_loss')
    assert 'every logged figure: bitwise identical' in done.stdout
    assert f'10 of 22 in {a}, 0 of 12 in {b}' in done.stdout  # a's odd tens have no partner


def test_train_figures_of_the_same_window_and_eval_figures_are_compared(tmp_path):
    a = mlp_log(20)
    b = [x for x in mlp_log(20, eval_loss=0.6) if x['step'] != 100 or 'eval_loss' not in x]
    done = compare(workdir(tmp_path, 'a', a), workdir(tmp_path, 'b', b))
    assert done.returncode == 0, done.stderr  # the final accuracies agree
    assert '*' not in done.stdout  # the same --log_every: every train mean is comparable
    assert 'every logged figure: largest difference 0.1' in done.stdout  # step 200's eval_loss
    assert '1 of 12 in' in done.stdout and '0 of 11 in' in done.stdout  # a's eval at step 100


@pytest.mark.parametrize('bad', [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize('where', ['a train line', 'the final line', 'both runs'])
def test_a_non_finite_figure_is_a_mismatch(tmp_path, bad, where):
    a, b = transformer_log(2.4), transformer_log(2.4)
    if where == 'the final line':
        b[-1]['eval_loss'] = bad
    else:
        b[0]['train_loss'] = bad
        if where == 'both runs':
            a[0]['train_loss'] = bad
    done = compare(workdir(tmp_path, 'a', a), workdir(tmp_path, 'b', b))
    assert done.returncode == 1
    line = one_error_line(done)
    at = 'eval_loss at the final line' if where == 'the final line' else 'train_loss at step 100'
    assert line.startswith(f'error: {at} of '), line
    assert f'is {bad}: a NaN or infinity is a mismatch' in line
    assert 'bitwise identical' not in done.stdout


def test_one_directory_given_twice_is_refused(tmp_path):
    a = workdir(tmp_path, 'a', transformer_log(2.4))
    for twice in (a, f'{a}/', tmp_path / 'a' / '..' / 'a'):
        line = one_error_line(compare(a, twice))
        assert line == f'error: {a} and {twice} are the same directory: compare two different runs'


def test_throughput_is_a_rounded_table(tmp_path):
    a = workdir(tmp_path, 'a', transformer_log(2.4))
    b = transformer_log(2.4)
    b[-1]['tokens_per_sec'] = 12345.6
    done = compare(a, workdir(tmp_path, 'b', b))
    assert done.returncode == 0, done.stderr
    table = done.stdout.split('\n\n')[-1].splitlines()
    assert table[0].split() == ['run', 'tokens_per_sec']
    assert table[1].split() == [str(a), '10,000']
    assert table[2].split() == [str(tmp_path / 'b'), '12,346']
    assert '{' not in done.stdout


def test_torn_and_garbled_lines_are_skipped_with_one_warning(tmp_path):
    a = workdir(tmp_path, 'a', transformer_log(2.4))
    b = workdir(tmp_path, 'b', transformer_log(2.4))
    log = b / 'metrics.jsonl'
    log.write_text('{"step": 50, "train_lo\n' + log.read_text() + '\x00garbage\n{"step": "x"}')
    found = log.read_bytes()
    done = compare(a, b)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines() == [
        f'warning: skipped 3 unparsable lines of {log} (torn or garbled)'
    ]
    assert 'bitwise identical' in done.stdout
    assert log.read_bytes() == found  # a reader: the log stays as it was found
    c = workdir(tmp_path, 'c', [])
    (c / 'metrics.jsonl').write_text('{"ste\n')
    done = compare(a, c)
    assert done.returncode != 0 and 'Traceback' not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f'error: {c / "metrics.jsonl"} has no readable line: all 1 are unparsable'
    )


@pytest.mark.parametrize(
    'args, error',
    [
        ((), 'error: expected two workdirs, got 0; usage: '),
        (('a',), 'error: expected two workdirs, got 1; usage: '),
        (('a', 'b', '--max_loss_gap=-1'), 'error: flag --max_loss_gap=-1: '),
        (('a', 'missing'), 'error: {tmp}/missing/metrics.jsonl does not exist'),
        (('a', 'unfinished'), 'error: {tmp}/unfinished has no final line: did it finish?'),
        (('a', 'no_loss'), 'error: the final line of {tmp}/no_loss/metrics.jsonl has no eval_loss'),
    ],
    ids=['no_workdir', 'one_workdir', 'bad_flag', 'missing_log', 'unfinished', 'final_no_loss'],
)
def test_every_error_is_one_line(tmp_path, args, error):
    workdir(tmp_path, 'a', transformer_log(2.4))
    workdir(tmp_path, 'unfinished', transformer_log(2.4)[:-1])
    workdir(tmp_path, 'no_loss', [{'step': 100, 'final': True, 'tokens_per_sec': 1.0}])
    paths = [a if a.startswith('--') else tmp_path / a for a in args]
    done = compare(*paths)
    line = one_error_line(done)
    assert line.startswith(error.format(tmp=tmp_path)), line
    assert done.returncode == 2  # each a refused input, an unfinished run's too


def with_config(path, **train):
    """Gives workdir `path` the config.json the train CLI writes, with `train` changed."""
    saved = {'model': 'mlp', 'model_config': {'hidden': [64]}, 'twin': 'auto', 'strategy': 'dp'}
    saved['train'] = {'steps': 200, 'seed': 0, 'learning_rate': 1e-3, 'log_every': 10, **train}
    (path / 'config.json').write_text(json.dumps(saved))
    return path


def test_other_settings_are_named_and_refused_unless_allowed(tmp_path):
    """600 against 400 steps used to be 'bitwise identical', exit 0: config.json was never read."""
    a = with_config(workdir(tmp_path, 'a', mlp_log(20)))
    b = with_config(workdir(tmp_path, 'b', mlp_log(20)), seed=1, learning_rate=0.01)
    assert compare(a, with_config(workdir(tmp_path, 'c', mlp_log(10)), log_every=20)).returncode == 0
    done = compare(a, b)
    line = one_error_line(done)
    assert done.returncode == 2  # another experiment is a refused input, not a disagreement (1)
    assert line == (
        f'error: {a} (A) and {b} (B) were trained with other settings: --learning_rate: A 0.001, '
        'B 0.01; --seed: A 0, B 1. Pass --allow_other_settings to compare them anyway'
    )
    done = compare(a, b, '--allow_other_settings')
    assert done.returncode == 0 and 'note: other settings (--allow_other_settings): ' in done.stdout
    (b / 'config.json').write_text('{"model": "mlp", "tra')  # torn
    assert one_error_line(compare(a, b)).startswith(f'error: {b}/config.json is not a readable')


def test_steps_one_run_only_reached_are_reported(tmp_path):
    """Runs of other lengths are judged at the last step both logged the final figure: they
    were judged at their own final steps (200 against 120), exit 1 where every step both logged
    agrees."""
    short = [x for x in mlp_log(20) if x['step'] <= 120 and not x.get('final')]
    # B's final accuracy, at its own last step, is 0.05 from A's at 200: no step both logged
    short.append({'step': 120, 'final': True, 'eval_loss': 0.5, 'eval_accuracy': 0.85})
    a = with_config(workdir(tmp_path, 'a', mlp_log(20)))
    b = with_config(workdir(tmp_path, 'b', short), steps=120)
    assert '--steps: A 200, B 120' in one_error_line(compare(a, b))
    done = compare(a, b, '--allow_other_settings')  # judged at step 100, where both agree
    assert done.returncode == 0, done.stderr
    assert f'note: 4 logged steps in {a} only (140..200): {b} ends at step 120' in done.stdout
    assert ('eval_accuracy at step 100 (the last step both logged it: A ends at step 200, B at '
            '120) 0.9000 vs 0.9000') in done.stdout
    assert 'bitwise identical where both logged it' in done.stdout


def test_each_runs_mesh_is_named_and_runs_on_other_meshes_compare(tmp_path):
    """Where each run ran comes first, its mesh as --mesh names it; a run saved before named
    meshes (fsdp's axis then 'data') is named as today's. Other meshes are no other settings."""
    a = with_config(workdir(tmp_path, 'a', mlp_log(20)))
    b = with_config(workdir(tmp_path, 'b', mlp_log(20)))
    for path, twin, strategy, mesh in ((a, 'explicit', 'composed', {'data': 2, 'fsdp': 2, 'model': 2}),
                                       (b, 'auto', 'fsdp', {'data': 8, 'model': 1})):  # fmt: skip
        saved = json.loads((path / 'config.json').read_text())
        saved.update(twin=twin, strategy=strategy, mesh=mesh)
        (path / 'config.json').write_text(json.dumps(saved))
    done = compare(a, b)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:2] == [
        f'A {a}: explicit composed on data:2,fsdp:2,model:2',
        f'B {b}: auto fsdp on fsdp:8,model:1',
    ]


@pytest.mark.slow  # a CLI in a subprocess
def test_a_line_averaged_over_fewer_steps_after_a_resume_is_paired_with_nothing(tmp_path):
    """A run resumed from a checkpoint saved before checkpoints kept the averaging window: its
    first train line averages only the steps since the resume and says how many. It used to be
    compared with the undisturbed run's line of the same step, a 'largest difference'."""
    resumed = mlp_log(20)
    resumed[1] = {'step': 40, 'train_loss': 1.5, 'train_steps_averaged': 5}  # steps 36..40
    done = compare(workdir(tmp_path, 'a', mlp_log(20)), workdir(tmp_path, 'b', resumed))
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line[:6].strip() == '40']
    assert rows == [['40', 'train_loss', '2', '1.5', '0.5', '*']]
    assert 'or one resumed a checkpoint that kept no averaging window' in done.stdout
    assert 'every logged figure: bitwise identical' in done.stdout


@pytest.mark.slow  # a CLI in a subprocess
def test_a_reader_that_stops_early_ends_compare_quietly(tmp_path):
    """`python -m tools.compare A B | head -n 1` ended in a BrokenPipeError traceback."""
    many = [{'step': s, 'train_loss': 1.0} for s in range(1, 3001)]
    many.append({'step': 3000, 'final': True, 'eval_loss': 1.0})
    a, b = workdir(tmp_path, 'a', many), workdir(tmp_path, 'b', many)
    cmd = [sys.executable, '-m', 'tools.compare', str(a), str(b)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline()  # 200 KB follow: more than a pipe holds
    proc.stdout.close()  # as `head -n 1` does
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 141 and err == b'', err[-2000:]  # 128 + SIGPIPE, nothing said


def on(path, platform, matmul='default'):
    """Gives workdir `path` a one-device transformer run's config.json whose segment ran on
    `platform` (what the train loop records) at --matmul_precision=`matmul`."""
    segment = {'from_step': 0, 'twin': 'auto', 'strategy': 'dp', 'devices': 1,
               'mesh': {'data': 1, 'model': 1}, 'platform': platform,
               'device_kind': {'tpu': 'TPU v5 lite', 'cpu': 'cpu'}[platform],
               'precision': {'param': 'float32', 'compute': 'float32', 'reduce': 'float32',
                             'matmul': matmul}}  # fmt: skip
    saved = {'model': 'transformer', 'model_config': {}, 'twin': 'auto', 'strategy': 'dp',
             'mesh': segment['mesh'], 'devices': 1, 'segments': [segment],
             'train': {'steps': 100, 'seed': 0}}  # fmt: skip
    (path / 'config.json').write_text(json.dumps(saved))
    return path


def test_float32_on_a_tpu_at_default_precision_is_judged_as_bfloat16(tmp_path):
    """A TPU's float32 dot at --matmul_precision=default is one bfloat16 pass: such a run is
    judged by the bf16 band (0.0164 of the loss here), and says so; at highest, or on the CPU,
    by float32's --max_loss_gap (0.01). The same two logs, 0.02 apart, get both verdicts."""
    cpu = on(workdir(tmp_path, 'cpu', transformer_log(2.42)), 'cpu')
    for matmul, code in (('default', 0), ('highest', 1)):
        tpu = on(workdir(tmp_path, f'tpu_{matmul}', transformer_log(2.40)), 'tpu', matmul)
        done = compare(tpu, cpu)
        assert done.returncode == code, done.stdout + done.stderr
        note = 'note: A ran float32 on a TPU at --matmul_precision=default'
        assert (note in done.stdout) == (matmul == 'default')
        assert done.stdout.splitlines()[0] == f'A {tpu}: auto dp on data:1,model:1 (TPU v5 lite)'
    assert compare(cpu, on(workdir(tmp_path, 'cpu2', transformer_log(2.40)), 'cpu')).returncode == 1
