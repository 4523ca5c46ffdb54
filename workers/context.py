"""What a worker process keeps per job between tasks: the spec, template, architecture, backend,
searcher and Optuna storage. Built from the job id on first use (tasks pass ids only)."""
from __future__ import annotations

import logging
import os
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from porter.arch import Arch, get_arch
from porter.backends.base import Backend
from porter.check import prefix_check, static_check
from porter.errors import PorterError
from porter.records import JobSpec
from porter.search import Searcher, SearchSpace
from porter.store import Store, open_store
from porter.template import Template, find_template, load_template

log = logging.getLogger(__name__)
_stores: dict[str, Store] = {}
_jobs: dict[tuple[str, int], "JobContext"] = {}
_backends: dict[tuple, Backend] = {}


def store_for(db_url: str | None = None) -> Store:
    from porter.store import db_url as resolve
    url = resolve(db_url)
    if url not in _stores:
        store = open_store(url)
        for attempt in range(5):
            try:   # Optuna creates its tables on first use: do it now, not in a task
                store.optuna_storage()
                break
            except PorterError:
                if attempt == 4:
                    raise
                time.sleep(0.5 + attempt)
        _stores[url] = store
    return _stores[url]


@dataclass
class JobContext:
    job_id: int
    store: Store
    spec: JobSpec
    template: Template
    arch: Arch
    study_name: str
    _backend: Backend | None = None
    _searcher: Searcher | None = None
    feasible: dict[int, bool] = field(default_factory=dict)   # trial number -> static check

    @property
    def sizes(self):
        return list(self.spec.sizes)

    @property
    def storage(self):
        return self.store.optuna_storage()

    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = backend_for(self.spec, self.arch)
        return self._backend

    def searcher(self, salt: str) -> Searcher:
        """The shared study of the job. Each worker seeds its own sampler differently (salt):
        workers with one seed would propose the same configurations at the same moment."""
        if self._searcher is None:
            be = self.backend()
            tpl, arch, sizes = self.template, self.arch, self.sizes
            space = SearchSpace(tpl.params, lambda cfg: be.allows(cfg) and
                                static_check(tpl, arch, cfg, sizes) is None,
                                prefix_check(tpl, arch, sizes))
            seed = (self.spec.seed * 1_000_003 + zlib.crc32(salt.encode())) % 2**31
            self._searcher = Searcher(space, self.spec.sampler, seed, storage=self.storage,
                                      study_name=self.study_name,
                                      warm_start=tpl.start_configs())
        return self._searcher

    def is_feasible(self, number: int, params: dict) -> bool:
        if number not in self.feasible:
            try:
                self.feasible[number] = static_check(self.template, self.arch, params,
                                                     self.sizes) is None
            except Exception:  # noqa: BLE001 - params of another template version
                self.feasible[number] = False
        return self.feasible[number]


def backend_for(spec: JobSpec, arch: Arch) -> Backend:
    """One backend per kind per process (one measuring child per GPU). Replay options come from
    the worker's environment: PORTER_REPLAY_HOLD=1 sleeps each recorded GPU time,
    PORTER_REPLAY_COMPILE=1 still compiles every variant (exercises the compile queue)."""
    key = (spec.backend, spec.replay, spec.seed if spec.backend == "gpu" else None)
    if key not in _backends:
        if spec.backend == "replay":
            from porter.backends.replay import ReplayBackend
            _backends[key] = ReplayBackend(
                spec.replay, hold=os.environ.get("PORTER_REPLAY_HOLD") == "1",
                compile=os.environ.get("PORTER_REPLAY_COMPILE") == "1")
        else:
            from porter.jobs import make_backend
            be, note = make_backend(spec, arch)
            if note:
                log.warning("job backend: %s", note)
            _backends[key] = be
    return _backends[key]


def job_context(job_id: int, db_url: str | None = None) -> JobContext:
    store = store_for(db_url)
    key = (store.url, job_id)
    if key not in _jobs:
        info = store.get_job(job_id)
        spec = info.spec
        _jobs[key] = JobContext(job_id, store, spec, template_for(store, info), get_arch(spec.arch),
                                info.study_name or f"job-{job_id}")
    return _jobs[key]


def forget(job_id: int, db_url: str | None = None) -> None:
    _jobs.pop((store_for(db_url).url, job_id), None)


def template_for(store: Store, info) -> Template:
    """The job's template: installed here by name or path, else rebuilt from the source and space
    file stored with the job (a template that arrived with a job is data)."""
    try:
        tpl = find_template(info.spec.template)
        if tpl.source_hash == info.template_hash:
            return tpl
    except PorterError:
        pass
    if not hasattr(store, "get_template"):
        return find_template(info.spec.template)
    stored = store.get_template(info.template_hash)
    folder = Path(tempfile.gettempdir()) / "porter-templates" / info.template_hash
    if not (folder / "space.toml").is_file():
        import tomllib
        src_name = tomllib.loads(stored.space_text).get("template", {}).get(
            "source", "kernel.cu")
        tmp = Path(tempfile.mkdtemp(prefix="porter-tpl-"))
        (tmp / src_name).write_text(stored.source)
        (tmp / "space.toml").write_text(stored.space_text)
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(tmp, folder)
        except OSError:
            pass  # another process wrote the same folder first
    return load_template(folder)
