"""What two runs were trained with, as compare sees it (`python -m tools.compare A B`): each
workdir's config.json, where each run ran, and the settings they do not share.

A run of another length, seed, batch, learning rate or model is a different experiment: a
difference is named, and is an error unless --allow_other_settings. What only changes the
logging (--log_every, --eval_every, --log_grad_norm) and where a run ran (twin, strategy, mesh)
may differ; where each ran is printed first, its mesh as --mesh names it (data:2,fsdp:2,model:2;
a run saved before named meshes, fsdp's axis then called 'data', as today's would be).
"""

import json
import pathlib

from shard_parity import UsageError, refuse

from . import pairing

LOGGING_ONLY = ('log_every', 'eval_every', 'log_grad_norm')  # change what is logged, not the run


def settings(workdir: str) -> dict | None:
    """A workdir's config.json (what the train CLI writes), or None if it has none."""
    path = pathlib.Path(workdir) / 'config.json'
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_bytes().decode('utf-8', errors='replace'))
        if not all(isinstance(saved.get(k), dict) for k in ('model_config', 'train')):
            raise ValueError('no model_config and train settings')
        return saved
    except (ValueError, OSError) as e:
        refuse(f'{path} is not a readable config.json ({str(e)[:100]})')


def other_settings(a: dict, b: dict) -> list[str]:
    """`--key: A x, B y` for each model or training setting the two runs do not share. A field
    one run lacks (saved before it existed) takes its default."""
    diffs = []
    if a.get('model') != b.get('model'):
        diffs.append(f"--model: A {a.get('model')}, B {b.get('model')}")
    defaults = {'model_config': {}, 'train': {}}
    for group in defaults:
        keys = sorted((set(a[group]) ^ set(b[group])) - set(LOGGING_ONLY))
        if keys:  # an older run: the defaults of today's TrainConfig (a heavier import)
            from shard_parity import config as cfg

            defaults['train'] = cfg.to_dict(cfg.TrainConfig())
            defaults['model_config'] = cfg.to_dict(cfg.TransformerConfig())  # num_experts...
        for key in sorted(set(a[group]) | set(b[group])):
            x, y = (r[group].get(key, defaults[group].get(key)) for r in (a, b))
            if key not in LOGGING_ONLY and x != y:
                diffs.append(f'--{key}: A {x}, B {y}')
    return diffs


def where(saved: dict) -> str | None:
    """Where a run ran, its mesh spelled as --mesh names it: 'explicit fsdp_tp on
    fsdp:4,model:2'. A run saved before named meshes (fsdp's axis then called 'data') is named
    as today's would be; None for a config.json without a strategy and mesh."""
    if not (isinstance(saved.get('strategy'), str) and isinstance(saved.get('mesh'), dict)):
        return None
    from shard_parity import plan as plans

    try:
        plan = plans.from_config(saved)
    except UsageError:
        return None
    segments = saved.get('segments') if isinstance(saved.get('segments'), list) else [{}]
    last = segments[-1] if isinstance(segments[-1], dict) else {}
    kind = last.get('device_kind') if last.get('platform') not in (None, 'cpu') else None
    where = f' ({kind})' if kind else ''
    return f"{saved.get('twin', '?')} {plan.strategy} on {plan.text()}{where}"


def check_settings(names, allow: bool) -> None:
    """Prints where each run ran (runs on other twins, strategies or meshes are comparable);
    exits with one line if the runs' settings differ, unless `allow` (--allow_other_settings)."""
    a, b = settings(names[0]), settings(names[1])
    for label, name, saved in (('A', names[0], a), ('B', names[1], b)):
        if saved is not None and (moved := pairing.history(label, saved)):  # each segment's plan
            print(f'{label} {name}: {pairing.changed(saved)}\n' + '\n'.join(moved))
        elif saved is not None and (ran := where(saved)):
            print(f'{label} {name}: {ran}')
    if a is None or b is None:
        missing = [n for n, x in zip(names, (a, b)) if x is None]
        print(f'note: no config.json in {" and ".join(missing)}: settings not compared')
        return
    diffs = other_settings(a, b)
    if not diffs:
        return
    if not allow:  # a different experiment: refused input (2), not a disagreement (1)
        refuse(
            f'{names[0]} (A) and {names[1]} (B) were trained with other settings: '
            + '; '.join(diffs)
            + '. Pass --allow_other_settings to compare them anyway'
        )
    print('note: other settings (--allow_other_settings): ' + '; '.join(diffs))
