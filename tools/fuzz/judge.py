"""The fuzzer's verdicts (python -m tools.fuzz): a worker's answer for a draw, judged against the
independent refusal table (tools/fuzz/table.py) and the one-device run; the workers themselves
(a subprocess per device count, restarted after a crash or a hang). The corpus of failures
found is tools/fuzz/entries.py's.
"""

import json
import os
import pathlib
import re
import select
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

from .draws import Draw
from .table import agrees, twin_refusals, violations


class Failure(NamedTuple):
    kind: str  # refused, reason, accepted, diverges, fails, refused_twin, checkpoint, collectives,
    # hang, crash
    twin: str | None  # the twin it concerns (None: the draw as a whole)
    message: str

    @property
    def signature(self) -> tuple:
        """What makes two failures the same bug while shrinking (as Hypothesis tells errors
        apart by type and line): the kind, the twin, and the line that raised or the phase
        that diverged."""
        where = re.search(r' at (\S+:\d+)|phase (\w+)', self.message)
        return self.kind, self.twin, where and where.group(1) or where and where.group(2)


def judge(draw: Draw, answer: dict) -> tuple[str, list[Failure]]:
    """(outcome, failures): outcome 'refused', 'passed' or 'failed'. A divergence is the
    worker's verdict at the bisector's tolerance (a bfloat16 draw's: the error model's)."""
    status, broken = answer['status'], violations(draw)
    whys = '; '.join(f'{b.flag}: {b.why}' for b in broken)
    if status in ('hang', 'crash'):
        return 'failed', [Failure(status, None, answer['message'])]
    if status == 'refused':
        msg = answer['message']
        if not broken:
            return 'failed', [Failure('refused', None, f'refused, the table accepts it: {msg}')]
        if not agrees(msg, broken):
            return 'failed', [Failure('reason', None, f'refused: {msg} (the table: {whys})')]
        return 'refused', []
    if broken:
        return 'failed', [Failure('accepted', None, f'accepted, the table refuses it: {whys}')]
    failures = []
    for twin, v in answer['twins'].items():
        expected = twin_refusals(draw, twin)  # the table's, for this twin alone
        if v['verdict'] == 'refused' and expected and agrees(v['message'], expected):
            continue  # refused in its one line, as the table says it must be
        if v['verdict'] != 'refused' and expected:
            whys = '; '.join(f'{b.flag}: {b.why}' for b in expected)
            failures.append(Failure('accepted', twin, f'ran, the table refuses it: {whys}'))
        elif v['verdict'] != 'agrees':
            kind = 'refused_twin' if v['verdict'] == 'refused' else v['verdict']
            failures.append(Failure(kind, twin, v['message']))
    return ('failed' if failures else 'passed'), failures


class Worker:
    """A `python -m tools.fuzz.worker N` subprocess, started on first use, reused across draws,
    restarted after a crash or a hang (its stderr kept in a temporary file, whose end a crash
    reports)."""

    def __init__(self, devices: int, env: dict):
        self.devices, self.env, self.proc = devices, env, None
        self.log = tempfile.NamedTemporaryFile('w+', prefix='fuzz_worker_', suffix='.log')

    def start(self):
        self.log.seek(0)
        self.log.truncate()
        root = str(pathlib.Path(__file__).parents[2])  # the folder that holds tools/
        self.proc = subprocess.Popen(
            [sys.executable, '-m', 'tools.fuzz.worker', str(self.devices)], cwd=root,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=self.env,
            process_group=0,  # a Ctrl-C at the terminal reaches the driver alone, which stops this
        )  # fmt: skip

    def run(self, draw: Draw, twins, timeout: float, checkpoint: str | None = None,
            target: str | None = None) -> dict:  # fmt: skip
        """The worker's answer for `draw` on `twins`; `checkpoint`: the mesh each twin that
        agrees restores its checkpoint on (tools/fuzz/checkpoint.py); `target`: the TPU slice
        each twin's step compiles for instead of running (tools/fuzz/target.py)."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
            timeout += 60  # JAX's start
        job = {'flags': draw.flags(), 'twins': list(twins)}
        if draw.trained:
            job['trained'] = draw.trained
        if draw.steps > 1:  # K > 1: the second step, from one device's state after the first
            job['steps'] = draw.steps
        if draw.partial:
            job['partial'] = draw.partial
        if checkpoint:
            job['checkpoint'] = checkpoint
        if target:
            job['target'] = target
        try:
            self.proc.stdin.write((json.dumps(job) + '\n').encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            return self.died()
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([self.proc.stdout], [], [], left)[0]:
                break
            line = self.proc.stdout.readline().decode()
            if not line:
                return self.died()
            if line.startswith('FUZZ '):
                return json.loads(line[5:])
        self.stop()
        return {'status': 'hang', 'message': f'no answer in {timeout:.0f} s (killed)'}

    def died(self) -> dict:
        code = self.proc.wait()
        self.log.flush()
        self.log.seek(0)
        tail = [ln for ln in self.log.read().splitlines() if ln.strip()][-3:]
        self.proc = None
        return {'status': 'crash', 'message': f'the worker died (exit {code}): ' + ' | '.join(tail)}

    def stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def worker_env(fast_compile: bool) -> dict:
    """The workers' environment: the tests' compile settings (parity_tests/conftest.py: XLA's
    optimisation level 0, a sixth of the CPU per compile) unless XLA_FLAGS names a level."""
    env = dict(os.environ)
    level = '--xla_backend_optimization_level'
    if fast_compile and level not in env.get('XLA_FLAGS', ''):
        env['XLA_FLAGS'] = f"{env.get('XLA_FLAGS', '')} {level}=0".strip()
    return env
