"""The Job page: /job?job=N&tab=NAME. Any job is reachable (search by id, template, arch or name;
an unknown id says so and shows no other job). The header and the open tab are fragments that
rerun every few seconds while the job is queued or running; only the open tab runs (lazy tabs
bound to ?tab=), and its frames are cached on the job's version, so a rerun with no new trial
redraws from the cache."""
from __future__ import annotations

import streamlit as st

from . import analysis, data, job_tabs, kernel

REFRESH_SECONDS = 2
TABS = {"Convergence": job_tabs.convergence, "Trials": job_tabs.trials,
        "Analysis": analysis.analysis, "Kernel": kernel.kernel_views,
        "Failures": job_tabs.failures, "Top configurations": job_tabs.top,
        "Export": job_tabs.exports}


def job_page() -> None:
    st.title("Job")
    u = data.url()
    job_id = _pick(u)
    if job_id is None:
        return
    job = data.job(u, job_id, data.version(u, job_id))
    live = job["status"] in data.LIVE
    every = REFRESH_SECONDS if live else None

    @st.fragment(run_every=every)
    def header():
        d = data.job(u, job_id, data.version(u, job_id))
        if d is None:
            st.warning(f"Job {job_id} was deleted.")
            return
        if live and d["status"] not in data.LIVE:
            st.rerun()   # finished: the whole page stops refreshing
        _header(d)
    header()
    _manage(u, job)
    tabs = st.tabs(list(TABS), key="tab", bind="query-params")
    for tab, (name, draw) in zip(tabs, TABS.items()):
        if not tab.open:
            continue
        with tab:
            @st.fragment(run_every=every)
            def body(draw=draw):
                draw(u, job, data.version(u, job_id))
            body()


def _pick(u: str) -> int | None:
    wanted = st.query_params.get("job")
    c = st.columns([2, 3])
    search = c[0].text_input("find a job", key="job_search",
                             placeholder="id, template, architecture, name or status")
    rows, total = data.job_choices(u, search)
    labels = {r["job"]: data.job_label(r) for r in rows}
    current = None
    if wanted is not None:
        if not str(wanted).isdigit():
            st.error(f"“{wanted}” is not a job id (a number).")
        elif (d := data.job(u, int(wanted), data.version(u, int(wanted)))) is None:
            st.error(f"No job {wanted} in {data.safe(u)}. Pick one below or search.")
        else:
            current = int(wanted)
            labels.setdefault(current, data.job_label(
                {"job": current, "template": d["template_name"], "arch": d["arch"],
                 "status": d["status"], "name": d["name"]}))
    elif rows and not search:
        current = rows[0]["job"]
    if not labels:
        c[1].info("No job matches." if search else "No jobs yet.")
        return None
    if current is not None:
        st.session_state["job_pick"] = current
    elif st.session_state.get("job_pick") not in labels:
        st.session_state.pop("job_pick", None)

    def picked():
        st.query_params["job"] = str(st.session_state["job_pick"])
    options = list(labels)
    if current is not None and current in options:
        options.remove(current)
        options.insert(0, current)
    c[1].selectbox(f"job ({total} match)" if search else "job", options, index=None,
                   format_func=labels.get, key="job_pick", on_change=picked,
                   placeholder="choose a job")
    if current is not None:
        st.query_params["job"] = str(current)
    return current


def _header(d: dict) -> None:
    spec = d["spec"] or {}
    sizes = ", ".join("x".join(map(str, s)) for s in spec.get("sizes", []))
    name = f" “{d['name']}”" if d["name"] else ""
    st.markdown(f"**job {d['id']}{name}: {d['template_name']}** on **{d['arch']}** · backend "
                f"`{spec.get('backend')}` · sampler `{spec.get('sampler')}` · sizes {sizes} · "
                f"status **{d['status']}**" + (" · fresh measurements" if spec.get("fresh")
                                              else "")
                + (f" · {d['message']}" if d["message"] else ""))
    counts = d["counts"]
    c = st.columns(5)
    c[0].metric("trials", d["n_trials"])
    c[1].metric("measured", d["n_measured"])
    c[2].metric("best ratio", data.fmt_ratio(d["best_ratio"]))
    c[3].metric("best objective", "-" if d["best_objective"] is None
                else f"{d['best_objective']:.4g}")
    c[4].metric("failed", sum(n for s, n in counts.items() if s in data.FAILED))
    budget = spec.get("trials")
    if d["status"] in data.LIVE and budget:
        st.progress(min(1.0, d["n_trials"] / budget),
                    text=f"{d['n_trials']} of {budget} trials")
    if spec.get("backend") == "compile-only" or (d["n_trials"] and not d["n_measured"]
                                                 and "compiled" in counts):
        st.warning("Compile-only job: variants were compiled, not measured.")
    if d["n_reused"]:
        st.caption(f"{d['n_reused']} of these trials reuse earlier jobs' measurements of the "
                   "same configurations (the trial table's 'reused from' column); submit with "
                   "fresh measurements to measure them again.")
    if d["notes"]:
        st.caption(f"notes: {d['notes']}")


def _manage(u: str, job: dict) -> None:
    store, job_id = data.store(u), job["id"]
    with st.expander("Manage: name, notes, cancel, delete"):
        with st.form("job_notes"):
            name = st.text_input("name", value=job["name"], key="job_name")
            notes = st.text_area("notes", value=job["notes"], key="job_notes_text")
            if st.form_submit_button("Save"):
                store.set_job_notes(job_id, name=name, notes=notes)
                data.job_choices.clear()
                st.rerun()
        c = st.columns(2)
        if job["status"] in data.LIVE:
            if c[0].button(f"Cancel job {job_id}", key="job_cancel"):
                store.request_cancel(job_id)
                st.rerun()
            c[1].caption("A queued or running job is cancelled before it can be deleted.")
            return
        sure = c[0].checkbox(f"Delete job {job_id} and its {job['n_trials']} trials for good",
                             key="job_delete_sure")
        if c[1].button("Delete", key="job_delete", disabled=not sure, type="primary"):
            store.delete_job(job_id)
            st.query_params.clear()
            st.session_state.pop("job_pick", None)
            st.switch_page("page_scripts/jobs.py")
