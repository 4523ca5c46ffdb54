"""Export: tuned kernels out of porter. This package owns turning a job's best trials into
files a user builds or imports without porter (`export.py`: the formats, the manifest that says
which job, template snapshot, architecture and GPU each entry came from; `fmt_cu*.py`: a
standalone `.cu` with a host launcher and an optional test program; `fmt_python.py` and
`runtime_py.py`: a module that launches the cubins with cuda-bindings and dispatches by size;
`fmt_torch.py`: a `torch.library` custom op; `formats.py`: header, kt-cache, fatbin) and the
job report (`report.py`). It reads the job's own template snapshot, never the folder on disk."""
