"""Spec: what a job is about, parsed once into frozen values. This package owns the template
format (`template.py`: a folder with CUDA source and `space.toml`, parsed into a `Template`), the
safe expression language its constraints, launch geometry and metrics are written in
(`expr.py`, the only evaluator in porter), the architecture table with each target's limits,
features and multiprocessor count (`arch.py`), and the content-addressed snapshot a job keeps of
its template (`snapshot.py`), from which every later step loads it."""
