"""Measurement backends behind one small base (`base.Backend`): `gpu` (a child process that owns
CUDA, times ours and the baseline with events, L2 flushed, and is restarted after a crash or a
hang), `compile-only` (no GPU of the architecture: trials stop after compiling and say so) and
`replay` (recorded measurements or a Kernel Tuner cache played back, labelled as such)."""
