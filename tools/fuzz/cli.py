"""Random configurations against one device: `python -m tools.fuzz` draws models, meshes and
schedules (draws.py), and every draw is either refused in the train CLI's one line,
for a reason table.py's independent table gives, or each twin's step equals the
one-device run's (the bisector's activations, loss, gradients and update, at its tolerance:
f32 round-off, or the error model where a draw computes or reduces in bfloat16).

    python -m tools.fuzz --minutes=10
    python -m tools.fuzz --draws=6 --seed=1 --twins=one_device,explicit
    python -m tools.fuzz --draws=40 --twins=one_device,tools.zoo.tp_pmean   # finds the bug

Draws are generated here, by Hypothesis, and run in a worker subprocess per device count
(worker.py) with --timeout, so a hang or a crash is a failure and not the end of the
run. A failure is shrunk (Hypothesis, in the domain's order: the MLP first, fewer axes, sizes
towards 1) and printed as the one `python -m tools.bisect` command that replays it. The corpus,
tools/fuzz/corpus/*.json, is replayed first: fixed entries must pass, known-open ones are
reported as known, and so is a new draw that hits one. Exit 0: no new failure; 1: one found;
2: bad input. docs/fuzzing.md says more.
"""

import statistics
import time

from absl import app, flags

from shard_parity import UsageError, refuse

from .draws import command
from .driver import Fuzz, Options, slices, zoo_axes

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
    "and its collectives held to the plan's axes (tools/fuzz/target.py), instead of run.",
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
    options = Options(
        timeout=TIMEOUT.value, shrink_minutes=SHRINK_MINUTES.value,
        max_failures=MAX_FAILURES.value, checkpoint_every=CHECKPOINT_EVERY.value,
        verbose=VERBOSE.value, bf16=BF16.value, models=tuple(MODELS.value),
        pp_schedules=PP_SCHEDULES.value,
    )  # fmt: skip
    fuzz = Fuzz(twins, int(DEVICES.value), TARGET.value, options)
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
