"""Measure: running a compiled variant and judging it. This package owns the measurement
backends (`backends/`: the GPU backend with its measuring child process, compile-only, replay of
recorded measurements), the ops that give a template its inputs, reference and vendor baseline
(`ops/`), and building TMA descriptors (`tma.py`). Nothing here touches the store or the
search."""
