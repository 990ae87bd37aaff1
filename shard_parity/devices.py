"""JAX's set-up before its backend starts (`configure_jax`: emulated CPU devices, FMA off, libtpu
kept quiet) and the plan's matmul precision (`use_matmul_precision`): what every CLI runs first.

libtpu kept quiet on a machine without a TPU chip: the device set-up above, and the inspector's
`--target` before it loads a TPU topology.

With the `[tpu]` extra installed (libtpu, the TPU compiler), JAX's first backend start and every
compile-only TPU topology load libtpu, which asks the machine (GCE metadata, environment
variables) which TPU it is on and prints five lines of warnings when nothing answers.
`quiet_libtpu()` answers for it where the machine has no TPU chip; on a TPU host libtpu finds
its own chips as always.
"""

import glob
import importlib.util
import logging
import os

import jax

from shard_parity import UsageError

# Given the first two, libtpu asks nothing and prints nothing. The accelerator type named here
# does not constrain the topologies compiled for (v5e, v5p, v4 compile alike under it). The
# third: libtpu takes a lock file (/tmp/libtpu_lockfile) to keep a second process off the chips,
# and without it a second compiling process (two inspectors, the tests and a CLI) fails to
# start; with no chip there is nothing to guard.
QUIET = {
    'TPU_ACCELERATOR_TYPE': 'v5litepod-8',
    'TPU_WORKER_HOSTNAMES': 'localhost',
    'ALLOW_MULTIPLE_LIBTPU_LOAD': '1',
}
_GOOGLE_PCI_VENDOR = '0x1ae0'


def libtpu_installed() -> bool:
    try:
        return importlib.util.find_spec('libtpu') is not None
    except ValueError:  # sys.modules['libtpu'] = None: hidden, as a test hides it
        return False


def tpu_chips_here() -> int:
    """TPU chips on this machine's PCI bus (Google's vendor id), as JAX's own start-up counts."""
    try:
        from jax._src import hardware_utils  # JAX's check, where this version has it

        return hardware_utils.num_available_tpu_chips_and_device_id()[0]
    except Exception:
        vendors = glob.glob('/sys/bus/pci/devices/*/vendor')
        return sum(open(v).read().strip() == _GOOGLE_PCI_VENDOR for v in vendors)


def quiet_libtpu() -> None:
    """Keeps libtpu's start-up warnings off a machine without a TPU chip (see QUIET); call before
    anything loads libtpu (the first JAX backend start, or the first TPU topology)."""
    if tpu_chips_here():  # a TPU host: what JAX says of its backends there is news
        return
    if libtpu_installed():
        for k, v in QUIET.items():
            os.environ.setdefault(k, v)
    # JAX's first start tries each backend it knows (libtpu's, the proxy's), finds none, falls
    # back to the CPU (or GPU) and logs each at INFO, which the CLIs' absl logging shows (jax
    # 0.11+ does so without libtpu too, on a platform left unpinned): drop those lines
    logger = logging.getLogger('jax._src.xla_bridge')
    if _NO_TPU_BACKEND not in logger.filters:  # once, however often this is called
        logger.addFilter(_NO_TPU_BACKEND)


class _NoTpuBackend(logging.Filter):
    def filter(self, record) -> bool:
        found = record.getMessage()
        return not (record.levelno <= logging.INFO and 'Unable to initialize backend' in found
                    or "backend 'tpu'" in found)  # fmt: skip


_NO_TPU_BACKEND = _NoTpuBackend()


NO_FMA = '--xla_cpu_max_isa=AVX'  # AVX has no fused multiply-add instructions


def configure_jax(cpu_devices: int | None, *, cpu_fma: bool = False, libtpu_lines=False) -> None:
    """Settings that only take effect before JAX's backend starts.

    cpu_devices: emulate this many CPU devices and run on the CPU; None keeps the default
      platform (a GPU if there is one) and still emulates 8 CPU devices for CPU-only machines.
    cpu_fma: let XLA's CPU code generator contract a*b+c into fused multiply-adds. Whether it does
      depends on how each program was fused, so the auto and explicit programs would round the
      optimizer update differently in the last bit, and those bits grow over hundreds of steps
      into visibly different runs. Without FMA the two twins are bitwise identical on the CPU.
    libtpu_lines: with libtpu installed (the [tpu] extra) on a machine without a TPU, JAX's
      backend start and every --target compile load it, and it prints five lines of warnings
      about the TPU it cannot find; they are kept off the screen unless this is set (--verbose).
    """
    if not libtpu_lines:
        from shard_parity.devices import quiet_libtpu

        quiet_libtpu()
    try:
        if cpu_devices is not None:
            jax.config.update('jax_platforms', 'cpu')
        jax.config.update('jax_num_cpu_devices', cpu_devices or 8)
    except RuntimeError as e:
        raise UsageError(
            f'--cpu_devices={cpu_devices} came too late: JAX has already started with '
            f'{jax.device_count()} devices, and the device count is fixed from then on. '
            'Set it before anything touches JAX (the train CLIs do it first thing).'
        ) from e
    if not cpu_fma and NO_FMA not in os.environ.get('XLA_FLAGS', ''):
        os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {NO_FMA}".strip()


def use_matmul_precision(name: str) -> None:
    """The plan's --matmul_precision for every dot traced from now on (jax's
    default_matmul_precision): 'default' leaves JAX's default (on a TPU one bfloat16 pass for
    float32 operands; on a GPU, TF32 where allowed), 'high' and 'highest' ask for more."""
    jax.config.update('jax_default_matmul_precision', None if name == 'default' else name)
