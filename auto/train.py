"""Train: `python -m auto.train --model=mlp --strategy=dp --cpu_devices=8`.

The loop, flags and outputs are shared by every twin (shard_parity/runtime/train.py); this twin
supplies only its strategy files (see auto/__init__.py).
"""

import sys

from absl import app

from shard_parity.runtime import parse_flags
from shard_parity.runtime.train import main

if __name__ == '__main__':
    # this twin, under the name it was run by; a refused flag exits 2, as every bad input
    app.run(main(sys.modules[__package__]), flags_parser=parse_flags)
