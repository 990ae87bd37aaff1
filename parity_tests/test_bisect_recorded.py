"""Claim: `python -m tools.bisect RUN_A RUN_B` judges a run from another machine by its recorded
steps (tools/bisect/recorded.py): that side's step s -> s+1 is read from its checkpoints s and
s+1, the other side runs step s live here from the recorded state s on the same batch, and the
two steps are held to the error model's update budgets. A recorded run agrees with a live
one-device run of the same settings; a change planted in the recorded step (one leaf's step
scaled by 1.05 in checkpoint s+1) is caught at that step and leaf, and one of half the leaf's
detection limit reads "agree" with the limits said. A run whose config.json says it trained
on a TPU is recorded without --recorded, and the verdict names the platform, the device kind
and the precision assumed (bf16's at --matmul_precision=default, float32's at highest). Bad
input is one line, exit 2. CPU only: the "TPU" run is a CPU run whose config.json says tpu."""

import json
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from parity_tests.helpers import CLI_MODELS, REPO, run_cli

STEPS = 2
LEAF = 'layers.1.kernel'  # the MLP's middle kernel: the leaf whose recorded step is planted


def tool(*args, timeout=600):
    return subprocess.run([sys.executable, '-m', 'tools.bisect', *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


@pytest.fixture(scope='module')
def pair(tmp_path_factory):
    """Two one-device explicit runs of the MLP, every step saved (step 0 too): 'recorded' plays
    the run from the other machine, 'live' the run whose twin and plan replay here."""
    root = tmp_path_factory.mktemp('recorded')
    flags = [*CLI_MODELS['mlp'], f'--steps={STEPS}', '--log_every=1', f'--eval_every={STEPS}']
    flags += ['--checkpoint_every=1', '--save_initial', '--keep=10', '--cpu_devices=1']
    for name in ('recorded', 'live'):
        result = run_cli('explicit', *flags, f'--workdir={root / name}')
        assert result.returncode == 0, result.stderr[-2000:]
    return root / 'recorded', root / 'live'


def planted(src, dst, scale: float, step: int = 0):
    """A copy of run `src` at `dst` whose checkpoint step+1 holds LEAF's step (new - old)
    scaled by `scale`, saved again whole (the checksums a read verifies are the new ones')."""
    from shard_parity.runtime import checkpoint
    from shard_parity.tools.bisect.leaves import named_leaves

    shutil.copytree(src, dst)
    _, _, before = checkpoint.read_numpy(dst, step)
    saved, _, after = checkpoint.read_numpy(dst, step + 1)
    i = [p for p, _ in named_leaves(after.params)].index(LEAF)
    old, new = jax.tree.leaves(before.params), jax.tree.leaves(after.params)
    new[i] = (old[i] + scale * (np.asarray(new[i], np.float64) - old[i])).astype(np.float32)
    params = jax.tree.unflatten(jax.tree.structure(after.params), new)
    shutil.rmtree(dst / 'checkpoints' / str(step + 1))
    with checkpoint.manager(dst, keep=100) as mngr:
        checkpoint.save(mngr, after._replace(params=params), saved)
        mngr.wait_until_finished()
    return dst


def on_tpu(src, dst, matmul='default'):
    """A copy of run `src` whose config.json says each segment ran on a TPU v5e chip."""
    shutil.copytree(src, dst)
    saved = json.loads((dst / 'config.json').read_text())
    for segment in saved['segments']:
        segment.update(platform='tpu', device_kind='TPU v5 lite')
        segment['precision']['matmul'] = matmul
    (dst / 'config.json').write_text(json.dumps(saved))
    return dst


@pytest.mark.slow  # five bisects of the MLP, each compiling its probes: about 2 min
def test_a_recorded_run_agrees_with_a_live_one_and_a_planted_step_is_caught(pair, tmp_path):
    recorded, live = pair
    clean = tool(recorded, live, '--recorded=A', '--cpu_devices=1', f'--from={recorded}@0',
                 '--json')  # fmt: skip
    assert clean.returncode == 0, clean.stderr[-2000:]
    report = json.loads(clean.stdout)
    assert not report['diverged'] and report['steps'] == 1 and report['first'] == 0
    assert report['twins'][0].startswith(f'{recorded} (explicit dp data:1,model:1 recorded on cpu')
    assert report['twins'][1] == f'{live} (explicit dp data:1,model:1 live on cpu)'
    assert report['model']['compute'] == 'float32'
    limit = report['limits']['update'][f'params.{LEAF}']
    assert 0 < limit < 0.01  # float32: a change of 5% is far beyond it

    # half the leaf's limit: not bitwise, within its budget, and the limits are said
    half = planted(recorded, tmp_path / 'half', 1 + limit / 2)
    agreed = tool(half, live, '--recorded=A', '--cpu_devices=1', f'--from={half}@0')
    assert agreed.returncode == 0, agreed.stdout + agreed.stderr[-2000:]
    verdict, limits, *_ = agreed.stdout.splitlines()
    assert 'agree within f32 round-off for 1 steps' in verdict, verdict
    assert 'A vs B: params.layers.1.kernel at 0.' in verdict, verdict
    assert 'loss loss at 0' in verdict, verdict  # the loss A logged for step 0, held to B's
    assert limits.startswith('It could not see (the detection limit, a relative change of one '
                             'leaf at step 0'), limits  # fmt: skip
    assert "note: A's step 0 -> 1 read from its checkpoints 0..1" in agreed.stdout

    wrong = planted(recorded, tmp_path / 'wrong', 1.05)
    caught = tool(wrong, live, '--recorded=A', '--cpu_devices=1', f'--from={wrong}@0')
    assert caught.returncode == 1, caught.stdout + caught.stderr[-2000:]
    lines = caught.stdout.splitlines()
    assert 'diverge at step 0, phase update (f32 error model)' in lines[0], lines[0]
    first = next(x for x in lines if x.startswith('  '))
    assert first.startswith(f'  A vs B: params.{LEAF}: '), caught.stdout
    assert 'B/A = 0.952381' in first, first  # 1 / 1.05: the planted scale, read back
    assert len([x for x in lines if x.startswith('  ')]) == 1, caught.stdout  # that leaf alone

    # the loss the recorded run logged for step 0 (its train line at step 1), 1% off
    logged = tmp_path / 'logged'
    shutil.copytree(recorded, logged)
    records = [json.loads(x) for x in (logged / 'metrics.jsonl').read_text().splitlines()]
    for record in records:
        if record['step'] == 1 and 'train_loss' in record:
            record['train_loss'] *= 1.01
    (logged / 'metrics.jsonl').write_text(''.join(json.dumps(x) + '\n' for x in records))
    caught = tool(logged, live, '--recorded=A', '--cpu_devices=1', f'--from={logged}@0')
    assert caught.returncode == 1, caught.stdout + caught.stderr[-2000:]
    lines = caught.stdout.splitlines()
    assert 'diverge at step 0, phase forward (f32 error model)' in lines[0], lines[0]
    assert lines[1].startswith('  loss: ') and 'B/A = 0.990099' in lines[1], caught.stdout
    assert "hint: A's loss of step 0 is the train_loss its metrics.jsonl logged at step 1" in (
        caught.stdout
    )


@pytest.mark.slow  # two bisects of the MLP: about 1 min
def test_a_run_from_a_tpu_is_recorded_and_says_the_precision_it_assumed(pair, tmp_path):
    recorded, live = pair
    chip = on_tpu(recorded, tmp_path / 'chip')
    result = tool(chip, live, '--cpu_devices=1', '--json')  # no --recorded: its config says tpu
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report['twins'][0] == (
        f'{chip} (explicit dp data:1,model:1 recorded on tpu (TPU v5 lite), float32 at '
        '--matmul_precision=default, one bfloat16 pass per dot: assumed bfloat16 compute)'
    )
    assert report['twins'][1].endswith('live on cpu)')
    assert report['model']['compute'] == 'bfloat16'  # the bf16 band
    assert any('train A again with --matmul_precision=highest' in n for n in report['notes'])
    assert report['first'] == STEPS - 1  # the logs never part: the newest pair of checkpoints

    highest = on_tpu(recorded, tmp_path / 'highest', matmul='highest')
    result = tool(live, highest, '--cpu_devices=1', '--json')
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report['twins'][1].endswith(
        'recorded on tpu (TPU v5 lite), float32 at --matmul_precision=highest: assumed float32 '
        'compute)'
    )
    assert report['twins'][0].endswith('live on cpu)') and report['model']['compute'] == 'float32'
    assert not any('--matmul_precision=highest' in n for n in report['notes'])


@pytest.mark.slow  # the runs of the fixture; each refusal comes before anything compiles
def test_bad_input_about_a_recorded_run_is_one_line_exit_2(pair, tmp_path):
    recorded, live = pair
    last = STEPS  # the run saved 0..STEPS: no checkpoint after its last step
    for args, said in (
        (['--recorded=C'], 'flag --recorded=C: value should be one of <A|B>'),
        ([f'--from={recorded}@{last}', '--recorded=A'],
         f'A={recorded} is recorded, its steps read from its checkpoints: step {last} -> '
         f'{last + 1} needs checkpoints {last}..{last + 1}, and it saved [0, 1, 2] (not 3)'),
        (['--recorded=B', f'--from={live}'], 'with a recorded run --from picks the step it '
         f'judges: give --from={live}@STEP, STEP one of [0, 1]'),
        (['--recorded=A', '--tolerance=f32'], '--tolerance=f32: a recorded run saved its steps, '
         'not its gradients, in its own precision'),
    ):  # fmt: skip
        result = tool(recorded, live, '--cpu_devices=1', *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr[-2000:])
        assert result.stderr.count('\n') == 1 and said in result.stderr, (args, result.stderr)

    alone = tool('--recorded=A', '--cpu_devices=1')
    assert alone.returncode == 2 and alone.stderr.count('\n') == 1, alone.stderr
    assert (
        'names which of two run directories is read from its checkpoints: give RUN_A RUN_B'
        in alone.stderr
    )

    both = tool(on_tpu(recorded, tmp_path / 'a'), on_tpu(live, tmp_path / 'b'), '--cpu_devices=1')
    assert both.returncode == 0, both.stderr[-2000:]  # logs bitwise alike: no replay
    assert (
        'note: both runs trained on another platform than this host (tpu (TPU v5 lite); '
        'here cpu): both replayed here' in both.stdout
    ), both.stdout


def test_the_recorded_side_is_the_run_from_another_platform_and_its_precision_is_named():
    """recorded.which picks the one run whose segments say another platform than this host (the
    tests' CPU); none where neither or both did (then a note); --recorded names it outright.
    recorded.assumed: float32 on a TPU at default is judged as bfloat16, at highest as float32."""
    from shard_parity.tools.bisect import recorded

    def run(platform=None, matmul='default', compute='float32'):
        segment = {
            'from_step': 0,
            'twin': 'explicit',
            'strategy': 'dp',
            'devices': 1,
            'mesh': {'data': 1, 'model': 1},
            'precision': {'compute': compute, 'reduce': 'float32', 'matmul': matmul},
        }
        if platform:
            segment.update(
                platform=platform, device_kind={'cpu': 'cpu'}.get(platform, 'TPU v5 lite')
            )
        return {'segments': [segment]}  # fmt: skip

    assert recorded.host() == 'cpu'
    assert recorded.which(run('tpu'), run('cpu'), None) == (0, [])
    assert recorded.which(run(), run('tpu'), None) == (1, [])  # a run saved before platforms: here
    assert recorded.which(run('cpu'), run(), None) == (None, [])
    assert recorded.which(run('cpu'), run('cpu'), 'B') == (1, [])
    index, notes = recorded.which(run('tpu'), run('tpu'), None)
    assert index is None and notes[0].startswith('both runs trained on another platform')
    seg = run('tpu')['segments'][0]
    assert recorded.assumed(seg) == (
        ('bfloat16', 'float32'),
        'float32 at --matmul_precision=default, one bfloat16 pass per dot: assumed bfloat16 '
        'compute',
    )
    seg = run('tpu', 'highest')['segments'][0]
    assert recorded.assumed(seg)[0] == ('float32', 'float32')
    assert recorded.assumed(run('cpu')['segments'][0]) == (
        ('float32', 'float32'),
        'assumed float32 compute',
    )
    bf16 = run('tpu', compute='bfloat16')['segments'][0]
    assert recorded.assumed(bf16) == (('bfloat16', 'float32'), 'assumed bfloat16 compute')


def test_the_step_judged_is_the_newest_pair_of_checkpoints_before_the_logs_part(monkeypatch):
    """recorded.chosen: the newest s whose checkpoints s and s+1 were both saved, before the
    first logged step where the logs differ (the newest of all where they never do, the first
    after it where none is before); --steps=N needs s..s+N; no pair at all is one line."""
    from shard_parity import UsageError
    from shard_parity.tools.bisect import recorded

    saved = {'r': [0, 1, 2, 5, 6, 9], 'lone': [0, 2, 4], 'late': [5, 6]}
    monkeypatch.setattr(recorded.checkpoint, 'steps', lambda run: saved[run])

    def chosen(part, steps=None, run='r', begin=None):
        return recorded.chosen(run, 'A', (run, 'live'), begin, part, steps)

    assert chosen(None) == (5, 1)
    assert chosen(3) == (1, 1)  # logged step 3 differs: step 2 -> 3 made it; 1 -> 2 is saved
    assert chosen(1) == (0, 1)
    assert chosen(1, steps=2) == (0, 2)  # each of steps 0 and 1 from its own checkpoint
    assert chosen(None, begin='r@0') == (0, 1)
    assert chosen(2, run='late') == (5, 1)  # none before the logs part: the nearest after
    with pytest.raises(UsageError, match=r'step 5 -> 7 needs checkpoints 5..7, and it saved '
                       r'\[0, 1, 2, 5, 6, 9\] \(not 7\)'):  # fmt: skip
        chosen(None, steps=2)
    with pytest.raises(UsageError, match=r'two in a row \(s and s\+1\), and it saved \[0, 2, 4\]'):
        chosen(None, run='lone')
    with pytest.raises(UsageError, match='give --from=r@STEP, STEP one of'):
        chosen(None, begin='elsewhere@1')
