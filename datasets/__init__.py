"""Local data for shard-parity: where it lives, and the one error every loader raises.

The data folder holds `mnist/` (the four official IDX gzip files) and `tinyshakespeare/input.txt`,
laid out exactly as `../shared/data`. Loaders live beside this file:

    from datasets import data_root, mnist, shakespeare
    splits = mnist.load(data_root())            # {'train': (x, y), 'test': (x, y)}
    train, val = shakespeare.load(data_root())  # uint8 byte tokens

This package is named `datasets`, like Hugging Face's; see `_warn_if_shadowing`.
"""

import importlib.metadata
import os
import pathlib
import warnings


class DataError(Exception):
    """An expected problem with the data: a missing, corrupt or unreachable file, or a bad value."""


def data_root(flag_value: str | None = None) -> pathlib.Path:
    """The data folder: the --data_dir flag, else $SHARD_PARITY_DATA_DIR, else a per-user cache."""
    if flag_value:
        return pathlib.Path(flag_value).expanduser()
    if env := os.environ.get('SHARD_PARITY_DATA_DIR'):
        return pathlib.Path(env).expanduser()
    cache = os.environ.get('XDG_CACHE_HOME') or pathlib.Path.home() / '.cache'
    return pathlib.Path(cache).expanduser() / 'shard-parity'


def _warn_if_shadowing() -> None:
    """Warn if Hugging Face `datasets` is installed too: whichever is first on sys.path wins."""
    try:
        importlib.metadata.distribution('datasets')  # ours is distributed as 'shard-parity'
    except Exception:  # not installed, or unreadable metadata: a warning is never worth a crash
        return
    warnings.warn(
        "shard-parity's top-level `datasets` package shadows Hugging Face `datasets`, which is "
        'also installed in this environment; install shard-parity in a separate virtualenv.',
        stacklevel=3,
    )


_warn_if_shadowing()  # module code runs once per process, so this warns once
