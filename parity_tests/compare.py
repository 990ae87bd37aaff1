"""Old name, kept as an alias of `python -m tools.compare`."""

import runpy

if __name__ == '__main__':
    runpy.run_module('shard_parity.tools.compare', run_name='__main__', alter_sys=True)
