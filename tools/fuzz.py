"""Random configurations against one device: `python -m tools.fuzz` draws models, meshes and
schedules (tools/fuzz_draws.py), and every draw is either refused in the train CLI's one line,
for a reason tools/fuzz_table.py's independent table gives, or each twin's step equals the
one-device run's (the bisector's activations, loss, gradients and update, at its tolerance:
f32 round-off, or the error model where a draw computes or reduces in bfloat16).

    python -m tools.fuzz --minutes=10
    python -m tools.fuzz --draws=6 --seed=1 --twins=one_device,explicit
    python -m tools.fuzz --draws=40 --twins=one_device,tools.zoo.tp_pmean   # finds the bug

Draws are generated here, by Hypothesis, and run in a worker subprocess per device count
(tools/fuzz_worker.py) with --timeout, so a hang or a crash is a failure and not the end of the
run. A failure is shrunk (Hypothesis, in the domain's order: the MLP first, fewer axes, sizes
towards 1) and printed as the one `python -m tools.bisect` command that replays it. The corpus,
tools/fuzz_corpus/*.json, is replayed first: fixed entries must pass, known-open ones are
reported as known, and so is a new draw that hits one. Exit 0: no new failure; 1: one found;
2: bad input. docs/fuzzing.md says more.
"""

import random
import statistics
import time

from absl import app, flags

from shard_parity import UsageError, refuse

try:
    import hypothesis  # noqa: F401  (the test extra's)
except ModuleNotFoundError:
    if __name__ == '__main__':
        refuse("tools.fuzz draws with Hypothesis, which is not installed: pip install -e '.[test]'")
    raise

from . import fuzz_judge as J
from .fuzz_draws import command, draws, mesh_text, other_mesh

MINUTES = flags.DEFINE_float(
    'minutes', None, 'Wall-clock budget of the random draws.', lower_bound=0
)
DRAWS = flags.DEFINE_integer(
    'draws', None, 'How many draws (default 20 without --minutes).', lower_bound=0
)
SEED = flags.DEFINE_integer('seed', 0, "Hypothesis's seed: the same seed, the same draws.")
DEVICES = flags.DEFINE_enum('devices', '8', ['8', '16'], 'Emulated CPU devices of every mesh.')
TWINS = flags.DEFINE_list(
    'twins', ['one_device', 'auto', 'explicit', 'typed'],
    'one_device and what is compared with it: twins (auto, explicit, typed), or import paths of '
    'strategy modules (tools.zoo.tp_pmean), as the bisector takes them.',
)  # fmt: skip
TIMEOUT = flags.DEFINE_integer(
    'timeout', 300, 'Seconds a draw may take before it is a hang.', lower_bound=1
)
SHRINK_MINUTES = flags.DEFINE_float(
    'shrink_minutes', 5, 'Wall-clock budget of shrinking a failure.', lower_bound=0
)
BF16 = flags.DEFINE_bool(
    'bf16', False, 'Draw bfloat16 --dtype/--reduce_dtype too, judged by the error model of '
    'docs/numerics.md (the bisector\'s --tolerance=model).',
)  # fmt: skip
MAX_FAILURES = flags.DEFINE_integer(
    'max_failures', 1, 'Stop after this many failures, each shrunk; another search starts after '
    'each with the next seed, and draws that fail as one found did pass.', lower_bound=1,
)  # fmt: skip
CHECKPOINT_EVERY = flags.DEFINE_integer(
    'checkpoint_every', 10, 'One draw in this many also trains 3 steps with each twin that '
    'agrees, saves an Orbax checkpoint, restores it on another drawn mesh and holds its arrays '
    "and its logits (on one device) bitwise to the saved run's. 0: never.", lower_bound=0,
)  # fmt: skip
TARGET = flags.DEFINE_string(
    'target', None, "A TPU slice (inspector/target.py's, e.g. tpu-v5e-8) of --devices chips, or "
    "'tpu': one such slice drawn per draw. Each draw's step is then compiled for it with libtpu "
    "and its collectives held to the plan's axes (tools/fuzz_target.py), instead of run.",
)  # fmt: skip
MODELS = flags.DEFINE_multi_enum(
    'models', ['mlp', 'transformer'], ['mlp', 'transformer'],
    'The models drawn (a module of yours that runs one only: --models=transformer).',
)  # fmt: skip
PP_SCHEDULES = flags.DEFINE_multi_enum(
    'pp_schedules', None, ['gpipe', '1f1b', 'interleaved'],
    "The schedules a 'stage' axis is drawn with (default all, GPipe mostly); 1f1b or interleaved "
    'alone draw data x stage pipelines of the transformer without experts, what they run on.',
)  # fmt: skip
CORPUS_ONLY = flags.DEFINE_bool('corpus_only', False, 'Replay the corpus, draw nothing.')
VERBOSE = flags.DEFINE_bool('verbose', False, 'One line per draw: its flags and its outcome.')


class BudgetSpent(BaseException):
    """Hypothesis lets a BaseException through: the driver's wall clock ends the search."""


class Fuzz:
    def __init__(self, twins, devices: int, target: str | None = None):
        self.twins, self.devices, self.target = twins, devices, target
        self.worker = J.Worker(devices, J.worker_env(True))
        self.entries = J.corpus()
        self.counts = {'refused': 0, 'passed': 0, 'failed': 0, 'known': 0}
        self.counts['checkpoints'] = 0  # of those, draws that also took the round trip
        self.seconds, self.signature, self.found, self.answers = [], None, [], {}
        self.deadline = self.shrink_until = 0.0
        self.limit = None

    def key(self, draw, twins=None, checkpoint=None) -> tuple:
        """What a draw runs, by which its answer is remembered: its flags, the twins, the
        mesh its checkpoint is restored on (None: no round trip) and the slice it compiles for."""
        return tuple(draw.flags()), tuple(twins or self.twins), checkpoint, self.slice(draw)

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
        every, shrinking = CHECKPOINT_EVERY.value, self.signature is not None
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
        answer = self.worker.run(draw, key[1], TIMEOUT.value, checkpoint, key[3])
        outcome, failures = J.judge(draw, answer)
        hits = [J.known(f, self.entries) for f in failures]
        new = [f for f, k in zip(failures, hits) if k is None]
        if failures and not new:
            outcome = 'known'
        if VERBOSE.value:
            restored = f' (checkpoint restored on {checkpoint})' if checkpoint else ''
            restored += f' (compiled for {key[3]})' if key[3] else ''
            print(f'{outcome}: {answer.get("seconds", "-")} s {" ".join(draw.flags())}{restored}',
                  flush=True)  # fmt: skip
            for f in failures:
                print(f'  {f.kind} {f.twin or ""}: {f.message.splitlines()[0]}')
        self.answers[key] = outcome, new, [k for k in hits if k]
        return self.answers[key]

    def replay(self) -> list:
        """The corpus first, each entry on those of its twins --twins names: (entry, its new
        failures) for each entry that is not as recorded."""
        bad = []
        for e in self.entries:
            twins = [t for t in e['twins'] if t in self.twins]  # those this run compares
            # an entry found compiling for a slice replays under --target only, and on its slice
            if (
                e['draw'].devices != self.devices
                or not twins
                or bool(e.get('target')) != bool(self.target)
            ):
                continue
            saved, self.target = self.target, e.get('target') or self.target
            try:
                outcome, new, hits = self.run(e['draw'], twins)
            finally:
                self.target = saved
            still = bool(hits) or outcome == 'known'
            if e['status'] == 'known':
                print(
                    f"corpus {e['name']}: known, {'still fails' if still else 'now passes: mark it fixed'}: {e['reason']}"
                )
            elif not new:
                print(f"corpus {e['name']}: {outcome}, as fixed")
            else:
                bad.append((e, new))
                print(f"corpus {e['name']}: FAILS again (fixed: {e['reason']})")
        return bad

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
                self.shrink_until = time.monotonic() + 60 * SHRINK_MINUTES.value
                self.found.append(None)
            failure = next(f for f in new if f.signature == self.signature)
            self.found[-1] = (draw, failure)  # the last that fails is the simplest yet
            raise AssertionError(failure.message)

    def search(self, seed: int, count: int | None, minutes: float | None):
        """Draws until `count` draws or `minutes` are spent; each failure found is shrunk (by
        one Hypothesis search), then the search starts again with the next seed."""
        forever = time.monotonic() + 10**9
        self.deadline = time.monotonic() + 60 * minutes if minutes is not None else forever
        self.limit = count
        while len(self.found) < MAX_FAILURES.value:
            self.signature = None
            if not self.hypothesis(seed + len(self.found)) or self.signature is None:
                return

    def hypothesis(self, seed: int) -> bool:
        """One Hypothesis search; False when the budget ended it."""
        from hypothesis import HealthCheck, Phase, given, settings
        from hypothesis import seed as seeded

        strategy = draws(self.devices, required=zoo_axes(self.twins), bf16=BF16.value,
                         models=tuple(MODELS.value), schedules=PP_SCHEDULES.value)  # fmt: skip
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

    from .sides import module_name

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


def main(argv):
    if len(argv) > 1:
        refuse(f'unexpected arguments {argv[1:]}: every setting is a --flag')
    twins = [t for t in TWINS.value if t != 'one_device']
    if not twins:
        refuse(f'--twins={",".join(TWINS.value)}: name a twin or module to compare with one_device')
    try:
        zoo_axes(twins)
    except UsageError as e:
        refuse(str(e))
    if TARGET.value:
        target_or_refuse(TARGET.value, int(DEVICES.value))
    fuzz = Fuzz(twins, int(DEVICES.value), TARGET.value)
    t0 = time.monotonic()
    try:
        bad = fuzz.replay()
        if not CORPUS_ONLY.value:
            count = DRAWS.value if DRAWS.value is not None or MINUTES.value else 20
            fuzz.search(SEED.value, count, MINUTES.value)
    finally:
        fuzz.worker.stop()
    print(summary(fuzz, time.monotonic() - t0))
    for entry, failures in bad:
        for f in failures:
            print(f"REGRESSION corpus {entry['name']}: {f.kind} {f.twin or ''}: {f.message}")
            print(f"  {command(entry['draw'], f.twin or twins[0])}")
    for draw, f in fuzz.found:
        print(f'FAILURE ({f.kind}{" of " + f.twin if f.twin else ""}), shrunk:\n{f.message}')
        if f.kind == 'checkpoint':  # no bisect command replays a round trip: the fuzzer does
            print(f'draw: {" ".join(draw.flags())}')
        elif f.kind == 'collectives' or fuzz.target:  # the program, as the inspector reads it
            print(f'draw: {" ".join(draw.flags())} compiled for {fuzz.slice(draw)}')
            print(
                f'inspect: python -m inspector {" ".join(draw.flags())} --target={fuzz.slice(draw)}'
            )
        else:
            print(f'reproduce: {command(draw, f.twin or twins[0])}')
    raise SystemExit(1 if bad or fuzz.found else 0)


def slices(devices: int) -> list[str]:
    """The TPU slices (inspector/target.py's) of `devices` chips."""
    from shard_parity.inspector.target import TARGETS

    return [n for n, t in TARGETS.items() if t.platform == 'tpu' and t.devices == devices]


def target_or_refuse(name: str, devices: int) -> None:
    """--target: a TPU slice of --devices chips (or 'tpu'), and libtpu to compile for it."""
    from shard_parity.devices import libtpu_installed

    fits = slices(devices)
    if name != 'tpu' and name not in fits:
        refuse(f'--target={name}: expected tpu or a TPU slice of --devices={devices} chips: '
               f'{", ".join(fits)}')  # fmt: skip
    if not libtpu_installed():
        refuse(f'--target={name} compiles with the TPU compiler, libtpu, which is not installed '
               'here: pip install -e ".[tpu]"')  # fmt: skip


def summary(fuzz: Fuzz, elapsed: float) -> str:
    c = fuzz.counts
    n = sum(c[k] for k in ('refused', 'passed', 'failed', 'known'))
    rate = f'{100 * c["refused"] / n:.0f}%' if n else '-'
    median = f'{statistics.median(fuzz.seconds):.1f} s' if fuzz.seconds else '-'
    per_minute = f'{60 * n / sum(fuzz.seconds):.1f}' if fuzz.seconds else '-'
    return (f'{n} draws in {elapsed:.0f} s: {c["passed"]} passed, {c["refused"]} refused '
            f'({rate}), {c["known"]} known, {c["failed"]} failed; {c["checkpoints"]} with a '
            f'checkpoint round trip; median {median} a draw, '
            f'{per_minute} draws/minute')  # fmt: skip


if __name__ == '__main__':
    from shard_parity.runtime import declare_key_flags, parse_flags

    declare_key_flags([])  # --help lists this module's flags and exits 0
    app.run(main, flags_parser=parse_flags)
