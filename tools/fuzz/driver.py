"""The fuzzer's search (python -m tools.fuzz; docs/fuzzing.md): Hypothesis draws whole steps
(tools/fuzz/draws.py), a worker subprocess runs each (tools/fuzz/worker.py), tools/fuzz/judge.py
judges it against the refusal table and one device, and a failure is shrunk to the simplest
draw that fails the same way; the corpus (tools/fuzz/entries.py) is replayed first.
tools/fuzz/cli.py is its command line.
"""

import dataclasses
import random
import time

from shard_parity import UsageError

from . import judge as J
from .draws import command, draws, inspect, mesh_text, other_mesh
from .entries import known


class BudgetSpent(BaseException):
    """Hypothesis lets a BaseException through: the driver's wall clock ends the search."""


@dataclasses.dataclass(frozen=True)
class Options:
    """How a search runs (tools/fuzz/cli.py's flags, whose defaults these are)."""

    timeout: int = 300  # seconds a draw may take before it is a hang
    shrink_minutes: float = 5  # the wall-clock budget of shrinking one failure
    max_failures: int = 1  # failures found (each shrunk) before the search stops
    checkpoint_every: int = 10  # one draw in this many takes a checkpoint round trip; 0: never
    verbose: bool = False  # one line per draw
    bf16: bool = False  # draw bfloat16 policies too
    models: tuple = ('mlp', 'transformer')
    pp_schedules: tuple | None = None  # those a 'stage' axis is drawn with (None: all)


class Fuzz:
    """The search: draws (Hypothesis), each run by a worker and judged (fuzz_judge.py), the
    answers remembered, each failure shrunk; the corpus replayed first (`replay`)."""

    def __init__(self, twins, devices: int, target: str | None = None, options=Options(),
                 entries=()):  # fmt: skip
        self.twins, self.devices, self.target, self.options = twins, devices, target, options
        self.worker = J.Worker(devices, J.worker_env(True))
        self.entries = list(entries)  # the corpus (tools/fuzz/entries.py's load), read by the CLI
        self.counts = {'refused': 0, 'passed': 0, 'failed': 0, 'known': 0}
        self.counts['checkpoints'] = 0  # of those, draws that also took the round trip
        self.seconds, self.signature, self.found, self.answers = [], None, [], {}
        self.deadline = self.shrink_until = 0.0
        self.limit = None
        self.bad, self.replayed = [], []  # the corpus's entries failing again; those replayed
        self.corpus_seconds = self.search_seconds = 0.0

    def key(self, draw, twins=None, checkpoint=None) -> tuple:
        """What a draw runs, by which its answer is remembered: its flags, the twins, the
        mesh its checkpoint is restored on (None: no round trip) and the slice it compiles for."""
        flags = (*draw.flags(), *([f'trained={draw.trained}'] if draw.trained else []),
                 *([f'partial={draw.partial}'] if draw.partial else []))  # fmt: skip
        return flags, tuple(twins or self.twins), checkpoint, self.slice(draw)

    def slice(self, draw) -> str | None:
        """The TPU slice a draw compiles for (None: it runs on the CPU): --target's, or under
        --target=tpu one of --devices chips, drawn from the draw itself."""
        if self.target != 'tpu':
            return self.target
        return random.Random(' '.join(draw.flags())).choice(slices(self.devices))

    def checkpoint(self, draw) -> str | None:
        """The mesh this draw's checkpoint is restored on, or None: one fresh draw in
        --checkpoint_every, and every draw while a checkpoint's failure is shrunk. Drawn from
        the draw itself, so that shrinking meets the same mesh for the same draw."""
        every, shrinking = self.options.checkpoint_every, self.signature is not None
        if not every or self.target or (shrinking and self.signature[0] != 'checkpoint'):
            return None
        if not shrinking and (len(self.seconds) + 1) % every:
            return None
        return mesh_text(other_mesh(draw, random.Random(' '.join(draw.flags()))))

    def run(self, draw, twins=None, checkpoint=None):
        """(outcome, new failures, known entries hit) of one draw, on `twins` (default
        --twins'), with a checkpoint's round trip to the mesh `checkpoint`; a draw seen
        before (shrinking meets many) is answered from memory."""
        key = self.key(draw, twins, checkpoint)
        if key in self.answers:
            return self.answers[key]
        answer = self.worker.run(draw, key[1], self.options.timeout, checkpoint, key[3])
        outcome, failures = J.judge(draw, answer)
        hits = [known(f, self.entries) for f in failures]
        new = [f for f, k in zip(failures, hits) if k is None]
        if failures and not new:
            outcome = 'known'
        if self.options.verbose:
            restored = f' (checkpoint restored on {checkpoint})' if checkpoint else ''
            restored += f' (compiled for {key[3]})' if key[3] else ''
            restored += f' (after {draw.trained} trained steps)' if draw.trained else ''
            restored += f' (--partial_window={draw.partial})' if draw.partial and not key[3] else ''
            print(f'{outcome}: {answer.get("seconds", "-")} s {" ".join(draw.flags())}{restored}',
                  flush=True)  # fmt: skip
            for f in failures:
                print(f'  {f.kind} {f.twin or ""}: {f.message.splitlines()[0]}')
        self.answers[key] = outcome, new, [k for k in hits if k]
        return self.answers[key]

    def skips(self, e) -> str | None:
        """Why corpus entry `e` does not replay in this run, as the flag that would replay it
        (None: it does). An entry found compiling for a slice replays under --target only."""
        if e['draw'].devices != self.devices:
            return f'--devices={e["draw"].devices}'
        if not set(e['twins']) & set(self.twins):
            return f'--twins=one_device,{",".join(e["twins"])}'
        if bool(e.get('target')) != bool(self.target):
            return f'--target={e["target"]}' if e.get('target') else 'no --target'
        if e['draw'].model not in self.options.models:
            return f'--models={e["draw"].model}'
        return None

    def replay(self, show_commands: bool = False):
        """The corpus first, each entry on those of its twins --twins names (and on its slice):
        each that is not as recorded joins self.bad as (entry, its new failures); with
        `show_commands`, each entry's bisect (or inspect) command is printed under it."""
        t0 = time.monotonic()
        try:
            for e in self.entries:
                if self.skips(e) is None:
                    self.replay_one(e, show_commands)
        finally:
            self.corpus_seconds = time.monotonic() - t0

    def replay_one(self, e, show_commands: bool):
        twins = [t for t in e['twins'] if t in self.twins]  # those this run compares
        saved, self.target = self.target, e.get('target') or self.target
        try:
            outcome, new, hits = self.run(e['draw'], twins)
        finally:
            self.target = saved
        self.replayed.append(e)
        still = bool(hits) or outcome == 'known'
        if e['status'] == 'known':
            now = 'still fails' if still else 'now passes: mark it fixed'
            print(f"corpus {e['name']}: known, {now}: {e['reason']}")
        elif not new:
            print(f"corpus {e['name']}: {outcome}, as fixed")
        else:
            self.bad.append((e, new))
            print(f"corpus {e['name']}: FAILS again (fixed: {e['reason']})")
        for twin in twins if show_commands else ():
            line = inspect(e['draw'], e['target']) if e.get('target') else command(e['draw'], twin)
            print(f'  {"inspect" if e.get("target") else "reproduce"}: {line}', flush=True)

    def example(self, draw):
        """Hypothesis's test: one draw. Raises AssertionError for a failure of the kind being
        shrunk (so that shrinking keeps to one bug: Failure.signature); a failure shrunk
        before, and every other outcome, passes."""
        if time.monotonic() > (self.shrink_until if self.signature else self.deadline):
            raise BudgetSpent
        if self.signature is None and self.limit is not None and len(self.seconds) >= self.limit:
            raise BudgetSpent
        checkpoint = self.checkpoint(draw)
        t0, fresh = time.monotonic(), self.key(draw, None, checkpoint) not in self.answers
        outcome, new, _ = self.run(draw, None, checkpoint)
        if self.signature is None and fresh and checkpoint and outcome != 'refused':
            self.counts['checkpoints'] += 1  # (a refused draw runs no step to save)
        if self.signature is None and fresh:
            self.seconds.append(time.monotonic() - t0)
            self.counts['failed' if new else outcome] += 1
        done = self.found[:-1] if self.signature else self.found  # those shrunk before
        new = [f for f in new if f.signature not in {f.signature for _, f in done}]
        sig = [f.signature for f in new]
        if new and (self.signature is None or self.signature in sig):
            if self.signature is None:  # found: shrinking gets its own budget
                self.signature = sig[0]
                self.shrink_until = time.monotonic() + 60 * self.options.shrink_minutes
                self.found.append(None)
            failure = next(f for f in new if f.signature == self.signature)
            self.found[-1] = (draw, failure)  # the last that fails is the simplest yet
            raise AssertionError(failure.message)

    def search(self, seed: int, count: int | None, minutes: float | None):
        """Draws until `count` draws or `minutes` are spent; each failure found is shrunk (by
        one Hypothesis search), then the search starts again with the next seed."""
        t0 = time.monotonic()
        self.deadline = t0 + (60 * minutes if minutes is not None else 10**9)
        self.limit = count
        try:
            while len(self.found) < self.options.max_failures:
                self.signature = None
                if not self.hypothesis(seed + len(self.found)) or self.signature is None:
                    return
                self.signature = None  # the failure is shrunk
        finally:
            self.search_seconds = time.monotonic() - t0

    def hypothesis(self, seed: int) -> bool:
        """One Hypothesis search; False when the budget ended it."""
        from hypothesis import HealthCheck, Phase, given, settings
        from hypothesis import seed as seeded

        strategy = draws(self.devices, required=zoo_axes(self.twins), bf16=self.options.bf16,
                         models=self.options.models, schedules=self.options.pp_schedules)  # fmt: skip
        checks = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

        @seeded(seed)
        @settings(max_examples=10**6, deadline=None, database=None, suppress_health_check=checks,
                  phases=[Phase.generate, Phase.shrink], report_multiple_bugs=False,
                  print_blob=False)  # fmt: skip
        @given(strategy)
        def test(draw):
            self.example(draw)

        try:
            test()
        except BudgetSpent:  # the search's budget, or this failure's shrinking's
            return self.signature is not None
        except Exception:  # the shrunk failure, replayed (or Hypothesis's flaky/group of it)
            if self.signature is None:
                raise
        return True


def zoo_axes(twins):
    """The axes every mesh needs for a strategy module of yours (a zoo entry): its STRATEGY's
    (none for the composed step or the twins)."""
    import importlib

    from shard_parity.plan import STRATEGY_AXES

    from ..bisect.sides import module_name

    for name in twins:
        if name in ('one_device', 'auto', 'explicit', 'typed'):
            continue
        try:
            module = importlib.import_module(module_name(name))
        except ImportError as e:
            raise UsageError(f'--twins: cannot import {name!r} ({e})') from e
        strategy = getattr(module, 'STRATEGY', 'composed')
        return () if strategy == 'composed' else STRATEGY_AXES[strategy]
    return ()


def slices(devices: int) -> list[str]:
    """The TPU slices (inspector/target.py's) of `devices` chips."""
    from shard_parity.inspector.target import TARGETS

    return [n for n, t in TARGETS.items() if t.platform == 'tpu' and t.devices == devices]
