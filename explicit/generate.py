"""Generate bytes: `python -m explicit.generate --workdir=runs/explicit_transformer`.

The sampling loop and flags are shared by every twin (shard_parity/runtime/generate.py); this
twin only places the restored parameters.
"""

import sys

from absl import app

from shard_parity.runtime import parse_flags
from shard_parity.runtime.generate import main

if __name__ == '__main__':
    # this twin, under the name it was run by; a refused flag exits 2, as every bad input
    app.run(main(sys.modules[__package__]), flags_parser=parse_flags)
