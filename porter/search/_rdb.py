"""The Searcher's three hot operations on a study in Optuna's RDBStorage, each one round trip
instead of Optuna's many.

Optuna's `study.ask` commits each parameter on its own and `create_new_trial` still checks each
parameter's distribution against the study with a query of its own (~20 ms for 8 parameters on
PostgreSQL); `study.tell` reads the whole trial back before writing it; `get_trials` reads six
tables. A service driver does these for every trial, two of them under the job's ask lock, so they
bound the trials/s of all drivers together. Here:

- open(params): the trial and all its parameters in one transaction (the study's row locked
  FOR UPDATE, as Optuna does, so trial numbers stay dense and unique);
- finish(trial_id, value): state, value and completion time in one transaction, only while the
  trial is still RUNNING (a trial another driver already failed stays as it is);
- changed(): one query for the trials that are new since the last call or were unfinished then.

What is written is what Optuna writes (same tables, same representations; dashboards and
`optuna.load_study` read it as usual). The parameters' distributions are checked against the
study once, when the first trial is opened, not per parameter and trial.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any, Mapping

import optuna
from optuna.distributions import (BaseDistribution, check_distribution_compatibility,
                                  distribution_to_json, json_to_distribution)
from optuna.trial import TrialState


@dataclass
class StudyTrial:
    """A trial of the study as changed() read it (the parts the Searcher and the job loop use)."""
    trial_id: int
    number: int
    state: TrialState
    datetime_start: datetime.datetime | None      # aware, UTC
    value: float | None = None
    params: dict[str, Any] = field(default_factory=dict)


def rows_for(study: optuna.Study, dists: Mapping[str, BaseDistribution]) -> "StudyRows | None":
    """StudyRows for a study stored in an RDBStorage (directly or through Optuna's cache), else
    None (an in-memory or journal study: the Searcher uses Optuna's own calls)."""
    storage = getattr(study, "_storage", None)
    backend = getattr(storage, "_backend", storage)
    study_id = getattr(study, "_study_id", None)
    if not isinstance(backend, optuna.storages.RDBStorage) or study_id is None:
        return None
    engine = backend.engine
    if engine.dialect.name == "postgresql":
        engine = _lean_engine(engine.url)
    return StudyRows(engine, study_id, dists)


_lean: dict[tuple[int, str], Any] = {}


def _lean_engine(url):
    """An engine of this process for the hot path, without the pre-ping round trip per checkout
    that the store's engines make (a connection the server dropped fails its statement, the
    pool drops it, and the job loop's retry takes a new one)."""
    import os
    from sqlalchemy import create_engine
    key = (os.getpid(), url.render_as_string(hide_password=False))
    if key not in _lean:
        _lean[key] = create_engine(url, pool_size=2, max_overflow=4,
                                   connect_args={"connect_timeout": 10})
    return _lean[key]


class StudyRows:
    def __init__(self, engine, study_id: int, dists: Mapping[str, BaseDistribution]):
        from optuna.storages._rdb import models
        self.engine, self.study_id = engine, study_id
        self.dists = dict(dists)
        self._json = {n: distribution_to_json(d) for n, d in self.dists.items()}
        self._m = models
        self._checked = False
        self._decoded: dict[str, BaseDistribution] = {}
        self._last_id = -1                  # every trial up to this id has been read...
        self._unfinished: set[int] = set()  # ...and these were unfinished when read

    # ---- writes
    def open(self, params: Mapping[str, Any]) -> tuple[int, int]:
        """A RUNNING trial with `params` (external values); (trial_id, number)."""
        from sqlalchemy import func, insert, select
        m = self._m
        trials, tp = m.TrialModel.__table__, m.TrialParamModel.__table__
        with self.engine.begin() as conn:
            conn.execute(select(m.StudyModel.__table__.c.study_id)
                         .where(m.StudyModel.__table__.c.study_id == self.study_id)
                         .with_for_update()).one()
            if not self._checked:
                self._check(conn)
            # the number counts the study's trials once its row is locked (not in the locking
            # statement, whose select list may be computed before the lock is granted)
            count = select(func.count(trials.c.trial_id)) \
                .where(trials.c.study_id == self.study_id).scalar_subquery()
            now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
            trial_id, number = conn.execute(insert(trials).values(
                number=count, study_id=self.study_id, state=TrialState.RUNNING,
                datetime_start=now).returning(trials.c.trial_id, trials.c.number)).one()
            conn.execute(insert(tp), [
                {"trial_id": trial_id, "param_name": n,
                 "param_value": self.dists[n].to_internal_repr(v),
                 "distribution_json": self._json[n]} for n, v in params.items()])
        return trial_id, number

    def finish(self, trial_id: int, value: float | None) -> bool:
        """COMPLETE with `value` (lower is better), or FAIL for None; False when the trial was
        no longer RUNNING (nothing is written then)."""
        from sqlalchemy import insert, literal, select, update
        m = self._m
        trials, tv = m.TrialModel.__table__, m.TrialValueModel.__table__
        state = TrialState.COMPLETE if value is not None else TrialState.FAIL
        now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
        done = update(trials).where(trials.c.trial_id == trial_id,
                                    trials.c.state == TrialState.RUNNING) \
            .values(state=state, datetime_complete=now).returning(trials.c.trial_id)
        if self.engine.dialect.name == "postgresql":
            # one statement (atomic by itself, so no BEGIN and COMMIT round trips): the update,
            # and the value for the row it updated, if it did
            if value is not None:
                stored, kind = m.TrialValueModel.value_to_stored_repr(value)
                u = done.cte("done")
                done = insert(tv).add_cte(u).from_select(
                    ["trial_id", "objective", "value", "value_type"],
                    select(u.c.trial_id, literal(0), literal(stored, tv.c.value.type),
                           literal(kind, tv.c.value_type.type))).returning(tv.c.trial_id)
            with self.engine.connect() as conn:
                return conn.execution_options(isolation_level="AUTOCOMMIT") \
                    .execute(done).first() is not None
        with self.engine.begin() as conn:
            if conn.execute(done).first() is None:
                return False
            if value is not None:
                stored, kind = m.TrialValueModel.value_to_stored_repr(value)
                conn.execute(insert(tv).values(trial_id=trial_id, objective=0, value=stored,
                                               value_type=kind))
        return True

    def _check(self, conn) -> None:
        """Our distributions against those the study already holds (Optuna's rule: a parameter
        keeps one distribution within a study)."""
        from sqlalchemy import select
        m = self._m
        tp, trials = m.TrialParamModel.__table__, m.TrialModel.__table__
        rows = conn.execute(select(tp.c.param_name, tp.c.distribution_json)
                            .join(trials, trials.c.trial_id == tp.c.trial_id)
                            .where(trials.c.study_id == self.study_id,
                                   tp.c.param_name.in_(list(self.dists)))
                            .distinct()).all()
        for name, text in rows:
            check_distribution_compatibility(json_to_distribution(text), self.dists[name])
        self._checked = True

    # ---- reads
    def changed(self) -> list[StudyTrial]:
        """The study's trials created since the last call, and those unfinished at the last
        call, in trial order. (Trials are created under the study's row lock, so ids are
        committed in order and none is skipped by reading on from the largest id seen.)"""
        from sqlalchemy import and_, or_, select
        m = self._m
        t, tp, tv = m.TrialModel.__table__, m.TrialParamModel.__table__, \
            m.TrialValueModel.__table__
        cond = t.c.trial_id > self._last_id
        if self._unfinished:
            cond = or_(cond, t.c.trial_id.in_(sorted(self._unfinished)))
        q = (select(t.c.trial_id, t.c.number, t.c.state, t.c.datetime_start, tv.c.value,
                    tv.c.value_type, tp.c.param_name, tp.c.param_value, tp.c.distribution_json)
             .select_from(t.outerjoin(tv, and_(tv.c.trial_id == t.c.trial_id,
                                               tv.c.objective == 0))
                          .outerjoin(tp, tp.c.trial_id == t.c.trial_id))
             .where(t.c.study_id == self.study_id, cond).order_by(t.c.trial_id))
        with self.engine.connect() as conn:
            # one statement, no transaction around it (BEGIN and ROLLBACK are round trips too)
            rows = conn.execution_options(isolation_level="AUTOCOMMIT").execute(q).all()
        out: dict[int, StudyTrial] = {}
        for r in rows:
            st = out.get(r.trial_id)
            if st is None:
                value = None if r.value_type is None else \
                    self._m.TrialValueModel.stored_repr_to_value(r.value, r.value_type)
                start = r.datetime_start.replace(tzinfo=datetime.timezone.utc) \
                    if r.datetime_start is not None else None
                st = out[r.trial_id] = StudyTrial(r.trial_id, r.number, r.state, start, value)
            if r.param_name is not None:
                st.params[r.param_name] = self._dist(r.distribution_json) \
                    .to_external_repr(r.param_value)
        for st in out.values():
            self._last_id = max(self._last_id, st.trial_id)
            if st.state.is_finished():
                self._unfinished.discard(st.trial_id)
            else:
                self._unfinished.add(st.trial_id)
        return list(out.values())

    def _dist(self, text: str) -> BaseDistribution:
        d = self._decoded.get(text)
        if d is None:
            d = self._decoded[text] = json_to_distribution(text)
        return d
