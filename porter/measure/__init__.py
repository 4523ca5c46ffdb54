"""Measure: running a compiled variant and judging it. This package owns the measurement
backends (`backends/`: the GPU backend with its measuring child process, compile-only, replay of
recorded measurements), the ops that give a template its inputs, reference and vendor baseline
(`ops/`), and building TMA descriptors (`tma.py`). Nothing here touches the store or the
search."""

# The measurement protocol's version: part of every measurement's identity (porter.job.cache), so
# raising it retires every earlier measurement from reuse. Raise it when what a figure means
# changes: inputs and their fills, warm-up and repeats, the L2 flush, the statistic kept, the
# vendor baseline's choice, the verification's tolerance, or the objective computed from them.
HARNESS_VERSION = 1
