"""The static check: configurations that cannot fit the architecture or the problem are
answered here, before anything reaches a compiler."""
from __future__ import annotations

from porter.spec.arch import Arch
from porter.build.compile import CompileResult
from porter.spec.template import Template

MAX_GRID_YZ = 65535


def static_check(template: Template, arch: Arch, config: dict, sizes) -> str | None:
    """None if the configuration may be compiled and run at every size, else the reason."""
    envs = [(size, template.env(config, arch, size)) for size in sizes or [None]]
    for c in template.constraints:
        for size, env in envs:
            try:
                ok = c(env)
            except ZeroDivisionError:
                ok = False
            if not ok:
                at = "" if size is None or not (c.names & set(template.size_names)) else \
                    f" at size {'x'.join(map(str, size))}"
                return f"constraint {c.text!r} fails{at}"
    for size, env in envs if sizes else ():
        launch = template.launch(config, arch, size, env)
        if launch.threads > arch.max_threads_per_block:
            return f"{launch.threads} threads per block > {arch.max_threads_per_block}"
        if launch.threads <= 0 or min(launch.grid) <= 0:
            return "empty launch"
        if launch.smem > arch.smem_per_block:
            return (f"{launch.smem} bytes of dynamic shared memory > {arch.smem_per_block} "
                    f"on {arch.name}")
        cluster = launch.cluster[0] * launch.cluster[1] * launch.cluster[2]
        if cluster > arch.max_cluster_size:
            return f"cluster of {cluster} blocks > {arch.max_cluster_size} on {arch.name}"
        if max(launch.grid[1:]) > MAX_GRID_YZ:
            return f"grid {launch.grid} exceeds {MAX_GRID_YZ} in y or z"
    return None


def prefix_check(template: Template, arch: Arch, sizes):
    """For enumerating the space: prefix_ok(k, prefix), False where a constraint that reads only
    the first k + 1 parameters (and sizes and architecture limits) fails at some size, so that
    every configuration starting so is infeasible (static_check still judges the survivors)."""
    names = template.param_names
    fixed = set(template.size_names) | set(arch.limits())
    at_depth: list[list] = [[] for _ in names]
    for c in template.constraints:
        need = c.names - fixed
        if need <= set(names):
            at_depth[max((names.index(n) for n in need), default=0)].append(c)
    bases = [template.env({}, arch, size) for size in sizes or [None]]

    def prefix_ok(k: int, prefix: dict) -> bool:
        if not at_depth[k]:
            return True
        for base in bases:
            env = {**base, **prefix}
            for c in at_depth[k]:
                try:
                    if not c(env):
                        return False
                except ZeroDivisionError:
                    return False
        return True
    return prefix_ok


def search_space(template: Template, arch: Arch, sizes, allows=None):
    """The template's space as the search sees it: feasible = `allows` (a backend's own refusals,
    if any) and the static check at every size; enumerated with prefix_check's pruning."""
    from porter.search.searcher import SearchSpace

    def feasible(config) -> bool:
        return (allows is None or allows(config)) and \
            static_check(template, arch, config, sizes) is None
    return SearchSpace(template.params, feasible, prefix_check(template, arch, sizes))


def resource_check(template: Template, arch: Arch, config: dict, compiled: CompileResult,
                   sizes) -> str | None:
    """After compiling: spills, registers and shared memory against the architecture."""
    r = compiled.resources
    if (r.spill_stores or r.spill_loads) and not template.allow_spills:
        return f"spills: {r.spill_stores} bytes stored, {r.spill_loads} loaded"
    if r.registers > arch.regs_per_thread:
        return f"{r.registers} registers per thread > {arch.regs_per_thread}"
    for size in sizes[:1]:
        launch = template.launch(config, arch, size)
        if r.registers * launch.threads > arch.regs_per_sm:
            return (f"{r.registers} registers x {launch.threads} threads > "
                    f"{arch.regs_per_sm} per SM")
        if r.smem_static + launch.smem > arch.smem_per_block:
            return (f"{r.smem_static} static + {launch.smem} dynamic bytes of shared memory > "
                    f"{arch.smem_per_block}")
    return None
