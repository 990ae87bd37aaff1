"""Claim: a run that moved meshes keeps its history. config.json records each segment (from which
step, the twin, strategy, mesh and schedule, and a slot for the precision policy); a config.json
written before segments reads as one; compare and bisect pair two runs segment by segment and
say where a comparison meets two plans (shard_parity/runtime/segments.py, tools/compare/pairing.py)."""

import dataclasses
import json
import subprocess
import sys

import pytest

from parity_tests.helpers import CLI_MODELS, REPO, run_cli
from shard_parity import plan as plans
from shard_parity.runtime import segments
from shard_parity.tools.compare import pairing

COMPOSED = plans.from_config({'strategy': 'composed', 'mesh': {'data': 2, 'fsdp': 2, 'model': 2}})
PP = plans.from_config({'strategy': 'pp', 'mesh': {'data': 4, 'stage': 2}, 'microbatches': 4,
                        'pp_schedule': '1f1b'})  # fmt: skip


def config(history=None, plan=COMPOSED):
    """A config.json as the train CLI writes it, with `history` as its segments (none: one
    written before segments were)."""
    saved = {'model': 'transformer', 'model_config': {}, 'train': {'steps': 60}, 'twin': 'explicit'}
    return {**saved, **plan.to_config(), **({'segments': history} if history else {})}


def test_segments_record_each_plan_from_the_step_it_started():
    first = segments.extend(None, segments.new('explicit', COMPOSED, 0))
    assert [(s['from_step'], s['strategy'], s['mesh']) for s in first] == [
        (0, 'composed', {'data': 2, 'fsdp': 2, 'model': 2})]  # fmt: skip
    assert first[0]['precision'] == dataclasses.asdict(plans.Precision())  # the whole policy
    same = segments.extend(config(first), segments.new('explicit', COMPOSED, 40))
    assert same == first  # resumed on the same plan: the same segment goes on
    moved = segments.extend(config(first), segments.new('explicit', PP, 40))
    assert [(s['from_step'], s['strategy'], s.get('pp_schedule')) for s in moved] == [
        (0, 'composed', None), (40, 'pp', '1f1b')]  # fmt: skip
    # resumed from a checkpoint older than the move: the history of that checkpoint, moved again
    assert segments.extend(config(moved, PP), segments.new('explicit', COMPOSED, 30)) == first
    old = config()  # a config.json written before segments: one from step 0
    assert segments.of(old) == first
    assert segments.extend(old, segments.new('explicit', PP, 40)) == moved
    bf16 = dataclasses.replace(COMPOSED, precision=plans.Precision(compute='bfloat16'))
    for other in (segments.new('explicit', bf16, 40), segments.new('auto', COMPOSED, 40)):
        assert len(segments.extend(config(first), other)) == 2  # another policy, another twin
    assert [segments.at(moved, s) for s in (0, 1, 40, 41, 60)] == [0, 0, 0, 1, 1]
    assert segments.describe(moved[1]) == 'explicit pp (1f1b) on data:4,stage:2'
    assert segments.describe(segments.new('explicit', bf16, 0)).endswith(
        'on data:2,fsdp:2,model:2, params=float32,compute=bfloat16,reduce=float32,matmul=default'
    )


def moved_at_42():
    history = segments.extend(config(), segments.new('explicit', PP, 42))
    return config(history, PP)


def test_the_stretches_pair_a_segment_of_each_run_and_name_their_plans():
    a, b = moved_at_42(), config()
    parts = pairing.Stretches(a, b)
    assert parts.moved and parts.starts == [(0, 0, 0), (42, 1, 0)]
    assert parts.at(42) == (segments.of(a)[0], segments.of(b)[0])
    assert parts.at(43) == (segments.of(a)[1], segments.of(b)[0])
    assert parts.plans(0) == 'A and B explicit composed on data:2,fsdp:2,model:2: the same plan'
    assert parts.plans(1).endswith(': different plans')
    assert parts.span(1) == 'steps 43..60'
    assert parts.crosses(40, 45) and not parts.crosses(45, 50)  # a mean over 41..45 meets both
    assert not pairing.Stretches(b, b).moved


BF16 = dataclasses.replace(COMPOSED, precision=plans.Precision(compute='bfloat16'))


def bf16_then_f32():
    """A run of 60 steps, 20 in bf16, then resumed in float32 on the same mesh."""
    history = segments.extend(None, segments.new('explicit', BF16, 0))
    return config(segments.extend(config(history), segments.new('explicit', COMPOSED, 20)))


def test_a_precision_change_is_named_and_its_bf16_stretch_keeps_the_band():
    """compare labelled a run that changed its precision on resume 'moved meshes', and judged
    it without the band (its config.json's model_config says float32): the band holds from
    its first bf16 segment on, a float32 run's steps without one."""
    moved = bf16_then_f32()
    assert pairing.changed(moved) == 'changed its precision (compute bfloat16 -> float32)'
    assert pairing.changed(moved_at_42()) == 'moved meshes' and pairing.changed(config()) is None
    parts = pairing.Stretches(moved, config())
    assert parts.policy(10) == parts.policy(50) == parts.policy() == ('bfloat16', 'float32')
    late = config(segments.extend(config(), segments.new('explicit', BF16, 40)))
    assert pairing.Stretches(late, config()).policy(40) == ('float32', 'float32')  # f32 until 40
    assert pairing.Stretches(late, config()).policy(41) == ('bfloat16', 'float32')


def with_segments(path, saved, lines):
    path.mkdir()
    (path / 'config.json').write_text(json.dumps(saved))
    (path / 'metrics.jsonl').write_text(''.join(json.dumps(x) + '\n' for x in lines))
    return path


def log(shift=0.0):
    lines = [{'step': s, 'train_loss': 3.0 - s / 100 + (shift if s > 42 else 0)}
             for s in range(10, 61, 10)]  # fmt: skip
    return lines + [{'step': 60, 'final': True, 'eval_loss': 2.0}]


@pytest.mark.slow  # a CLI in a subprocess
def test_compare_shows_each_runs_segments_and_a_verdict_for_each_stretch(tmp_path):
    a = with_segments(tmp_path / 'a', moved_at_42(), log(1e-6))
    b = with_segments(tmp_path / 'b', config(), log())
    done = subprocess.run([sys.executable, '-m', 'tools.compare', str(a), str(b)], cwd=REPO,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.splitlines()[:4] == [
        f'A {a}: moved meshes',
        '  A steps 1..42: explicit composed on data:2,fsdp:2,model:2',
        '  A steps 43..60: explicit pp (1f1b) on data:4,stage:2',
        f'B {b}: explicit composed on data:2,fsdp:2,model:2',
    ]
    same = '-- steps 1..42: A and B explicit composed on data:2,fsdp:2,model:2: the same plan'
    assert same in out
    assert ('-- steps 43..60: A explicit pp (1f1b) on data:4,stage:2, B explicit composed on '
            'data:2,fsdp:2,model:2: different plans') in out  # fmt: skip
    assert [line.split()[-1] for line in out.splitlines() if line.startswith('    50')] == ['~']
    assert 'averaged over steps of two segments (a run moved inside its window)' in out
    assert (
        'steps 1..42 (A and B explicit composed on data:2,fsdp:2,model:2: the same plan): '
        'bitwise identical; steps 43..60' in out
    )
    assert 'different plans): largest difference 1e-06' in out


@pytest.mark.slow  # a CLI in a subprocess
def test_compare_judges_a_run_back_in_float32_by_the_band(tmp_path):
    far = [{'step': 10, 'train_loss': 3.5}] + log()[1:]  # 0.6 apart at step 10, in bf16
    a = with_segments(tmp_path / 'a', bf16_then_f32(), far)
    b = with_segments(tmp_path / 'b', config(), log())
    done = subprocess.run([sys.executable, '-m', 'tools.compare', str(a), str(b)], cwd=REPO,
                          capture_output=True, text=True)  # fmt: skip
    assert done.stdout.splitlines()[0] == (
        f'A {a}: changed its precision (compute bfloat16 -> float32)'
    )
    assert (
        done.returncode == 1
        and 'train_loss at step 10 differs by 0.6, outside the band' in done.stderr
    ), done.stdout + done.stderr


@pytest.mark.slow
# about 35 s: exhaustive (a run moved between meshes, and between schedules, keeps its history:
# test_composed.py, test_pp_schedules.py and the tests above)
@pytest.mark.exhaustive
def test_a_run_moved_from_a_composed_mesh_to_1f1b_keeps_its_history(tmp_path):
    """10 steps on data:2,fsdp:2,model:2, then 10 on data:4,stage:2 under 1F1B: config.json
    names both; compare pairs it with a run that never moved, stretch by stretch (bitwise
    before the move, round-off apart after it, where the plans differ), and so does the
    bisector (its notes); both exit 0."""
    flags = [*CLI_MODELS['transformer'], '--num_layers=2', '--cpu_devices=8', '--log_every=5']
    flags += ['--eval_every=5', '--decay_steps=40']
    moved, calm = tmp_path / 'moved', tmp_path / 'calm'
    first = ['--mesh=data:2,fsdp:2,model:2', '--steps=10', f'--workdir={moved}']
    assert run_cli('explicit', *flags, *first).returncode == 0
    second = ['--mesh=data:4,stage:2', '--pp_schedule=1f1b', '--steps=20', f'--workdir={moved}']
    done = run_cli('explicit', *flags, *second)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = json.loads((moved / 'config.json').read_text())
    assert [(s['from_step'], s['strategy'], s.get('pp_schedule')) for s in saved['segments']] == [
        (0, 'composed', None), (10, 'pp', '1f1b')]  # fmt: skip
    assert 'precision' in saved['segments'][1]
    calm_flags = ['--mesh=data:2,fsdp:2,model:2', '--steps=20', f'--workdir={calm}']
    assert run_cli('explicit', *flags, *calm_flags).returncode == 0
    compared = run_cli('tools', str(moved), str(calm), program='compare')
    assert compared.returncode == 0, compared.stderr[-2000:]
    assert f'A {moved}: moved meshes' in compared.stdout
    assert 'A explicit pp (1f1b) on data:4,stage:2, B explicit composed' in compared.stdout
    assert (
        'steps 1..10 (A and B explicit composed on data:2,fsdp:2,model:2: the same plan): '
        'bitwise identical' in compared.stdout
    )
    bisected = run_cli('tools', str(moved), str(calm), program='bisect')
    assert bisected.returncode == 0, bisected.stderr[-2000:]
    assert (
        'note: A moved meshes: steps 1..10: explicit composed on data:2,fsdp:2,model:2; '
        'steps 11..20: explicit pp (1f1b) on data:4,stage:2' in bisected.stdout
    )
    assert (
        'note: steps 11..20: A explicit pp (1f1b) on data:4,stage:2, B explicit composed on '
        'data:2,fsdp:2,model:2: different plans' in bisected.stdout
    )
