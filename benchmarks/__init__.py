"""Benchmarks: measured figures, never assertions. Run `python -m benchmarks.run`."""

# the sections of `python -m benchmarks.run`, in the report's order (its flags: options.py)
SECTIONS = [
    'twins', 'sweep', 'attention', 'generation', 'nanogpt', 'strategies', 'context', 'cli',
    'memory', 'memory_101m',
]  # fmt: skip


class SectionFailed(Exception):
    """A section that could not run (a child process's own one-line error, passed on): the
    run prints the line and exits with `status`."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status
