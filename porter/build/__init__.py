"""Build: from a configuration to a binary, or a reason why not. This package owns the static
checks run before any compile (`check.py`: constraints, architecture limits, the search space's
prefix pruning; resource checks after it), NVRTC compilation with its on-disk cache
(`compile.py`), and reading a cubin's resource figures (`cubin.py`: registers, shared memory,
stack frame, the same on every compiler build)."""
