"""`python -m parity_tests.compare A B`: it agrees when the runs agree, for both models' logs, and
says why when they do not."""

import json
import subprocess
import sys

from parity_tests.helpers import REPO


def workdir(tmp_path, name, lines):
    path = tmp_path / name
    path.mkdir()
    (path / 'metrics.jsonl').write_text(''.join(json.dumps(x) + '\n' for x in lines))
    return path


def compare(*args):
    cmd = [sys.executable, '-m', 'parity_tests.compare', *map(str, args)]
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
    assert done.returncode != 0
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
    assert done.returncode != 0
    assert 'final eval_accuracy values differ by 0.0500 > --max_accuracy_gap=0.003' in done.stderr


def test_an_mlp_run_beside_a_transformer_run_is_refused(tmp_path):
    a = workdir(tmp_path, 'a', [MLP_FINAL])
    b = workdir(tmp_path, 'b', transformer_log(0.2))
    for pair in ((a, b), (b, a)):
        done = compare(*pair)
        assert done.returncode != 0 and 'only one of' in done.stderr, done.stderr


def test_an_empty_log_is_named(tmp_path):
    a = workdir(tmp_path, 'a', transformer_log(2.4))
    b = workdir(tmp_path, 'b', [])
    done = compare(a, b)
    assert done.returncode != 0
    assert f'{b / "metrics.jsonl"} is empty' in done.stderr
