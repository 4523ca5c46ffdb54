"""Kernel Porter: ports GPU kernel templates to new architectures and tunes them there.

The Python API (porter/api.py): `porter.port(...)`, `porter.submit(...)`, `porter.get_job(ID)`,
`porter.jobs()`, each giving Job objects with `.best()`, `.trials()` and `.export(fmt, path)`."""
from porter.api import Job, get_job, jobs, port, submit
from porter.errors import PorterError

__all__ = ["Job", "PorterError", "get_job", "jobs", "port", "submit"]
