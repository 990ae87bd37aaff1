"""Local data for shard-parity: where it lives, and the one error every loader raises.

The data folder holds `mnist/` (the four official IDX gzip files) and `tinyshakespeare/input.txt`,
laid out exactly as `../shared/data`. Loaders live beside this file:

    from shard_parity.datasets import mnist, shakespeare
    from shard_parity.datasets.root import data_root
    splits = mnist.load(data_root())            # {'train': (x, y), 'test': (x, y)}
    train, val = shakespeare.load(data_root())  # uint8 byte tokens

The folder has no __init__.py: installed, it is `shard_parity.datasets`, and from a checkout's
root a bare `import datasets` still finds Hugging Face's `datasets` if it is installed (a regular
package wins over a folder without __init__.py).
"""

import os
import pathlib


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
