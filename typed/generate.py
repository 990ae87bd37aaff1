"""Generate bytes: `python -m typed.generate --workdir=runs/typed_transformer`.

The sampling loop and flags are shared by every twin (shard_parity/runtime/generate.py); this
twin only places the restored parameters.
"""

from absl import app

import typed
from shard_parity.runtime.generate import main

if __name__ == '__main__':
    app.run(main(typed))
