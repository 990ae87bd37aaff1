"""How long the save after SIGTERM takes, against a scheduler's grace before SIGKILL (30 s by
default in Kubernetes, terminationGracePeriodSeconds, and in SLURM, KillWait):

    python -m benchmarks.grace                      # the 101M transformer, dp and fsdp, 8 devices
    python -m benchmarks.grace --strategies=fsdp --num_layers=2

Each strategy runs the train CLI (`python -m explicit.train`, 8 emulated CPU devices), waits
for --after logged steps, sends SIGTERM, and watches the workdir: the seconds until the
checkpoint of the step it stopped at is complete (Orbax renamed it into place: a SIGKILL from
then on loses nothing), until its checksums are written, and until the process exits. A probe,
not a section of benchmarks.run: its figures go to benchmarks/results/NOTES.md and
docs/errors.md. The machine's load average is printed beside them: on a shared host the step in
flight and the write stretch with it.
"""

import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

from absl import app, flags

STRATEGIES = flags.DEFINE_list('strategies', ['dp', 'fsdp'], 'Strategies to time.')
AFTER = flags.DEFINE_integer('after', 3, 'Logged steps before the SIGTERM.', lower_bound=1)
LAYERS = flags.DEFINE_integer('num_layers', 8, 'Layers of the transformer (8: 101M parameters).')
# the README's 101M-parameter transformer (benchmarks/memory.py's HEADLINE), as flags
SHAPE = ['--model=transformer', '--num_heads=8', '--num_kv_heads=8', '--embed_dim=1024',
         '--seq_len=32', '--batch_size=8', '--warmup_steps=10']  # fmt: skip


def complete(folder: pathlib.Path) -> list[int]:
    """The steps whose checkpoint Orbax has renamed into place."""
    return [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []


def time_one(strategy: str, workdir: pathlib.Path) -> dict:
    """Seconds from SIGTERM to the checkpoint, its checksums and the exit of one run."""
    flags_ = [*SHAPE, f'--num_layers={LAYERS.value}', f'--strategy={strategy}', '--log_every=1',
              '--eval_every=1000000', '--checkpoint_every=1000000', '--steps=1000000',
              '--cpu_devices=8', f'--workdir={workdir}']  # fmt: skip
    proc = subprocess.Popen([sys.executable, '-m', 'explicit.train', *flags_],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    metrics, folder = workdir / 'metrics.jsonl', workdir / 'checkpoints'
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= AFTER.value):
        if proc.poll() is not None:
            raise RuntimeError(f'the run ended first:\n{proc.stderr.read()[-2000:]}')
        time.sleep(0.1)
    load = os.getloadavg()[0]
    proc.send_signal(signal.SIGTERM)
    t0, seen = time.perf_counter(), {}
    while proc.poll() is None:
        now = time.perf_counter() - t0
        for step in complete(folder):
            seen.setdefault('checkpoint_s', now)
            if (folder / str(step) / 'checksums.sha256').exists():
                seen.setdefault('checksums_s', now)
        time.sleep(0.05)
    seen['exit_s'] = time.perf_counter() - t0
    err = proc.stderr.read()
    stopped = [line for line in err.splitlines() if 'interrupted at step' in line]
    size = sum(f.stat().st_size for f in folder.rglob('*') if f.is_file())
    return {'strategy': strategy, 'load': load, 'exit_code': proc.returncode, **seen,
            'gb': size / 1e9, 'said': stopped[-1] if stopped else err[-300:]}  # fmt: skip


def main(argv):
    print('strategy  load  exit  checkpoint_s  checksums_s  exit_s   GB  said')
    for strategy in STRATEGIES.value:
        with tempfile.TemporaryDirectory() as workdir:
            r = time_one(strategy, pathlib.Path(workdir))
        saved, summed = (r.get(k, float('nan')) for k in ('checkpoint_s', 'checksums_s'))
        print(f"{r['strategy']:<8} {r['load']:>5.1f} {r['exit_code']:>5} {saved:>13.1f} "
              f"{summed:>12.1f} {r['exit_s']:>7.1f} {r['gb']:>4.2f}  {r['said']}", flush=True)


if __name__ == '__main__':
    app.run(main)
