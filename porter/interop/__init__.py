"""Interop: exchanging work with Kernel Tuner. This package owns reading its cache files
(`kt_cache.py`, the replay backend's and the search benchmark's source of recorded spaces) and
importing a kernel with its T1 specification as a porter template (`kt.py`)."""
