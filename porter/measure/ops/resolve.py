"""Finding an op's reference and baseline functions, and the checks a template's op must pass
before a job is recorded (on any machine, with or without a GPU).

Rules: `module:function` is imported where the job is measured, so it must be an installed
module (a package of the user's, or porter's built-in library porter.measure.ops.refs). A module
that is a file of the template folder (`reference:softmax` beside reference.py) is code that
arrived with the template: it runs only in embedded mode with --trust-template-code, and the
service never imports it."""
from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
from pathlib import Path

from porter.errors import TemplateError

SERVICE_REFUSAL = ("the service never imports code that arrives with a job: install the module "
                   "as a package on the workers, or use porter port --trust-template-code here")


def local_module(folder: Path, module: str) -> Path | None:
    """The template folder's own file for `module`, if that is what the name refers to."""
    if "." in module:
        return None
    p = Path(folder) / f"{module}.py"
    return p if p.is_file() else None


def resolve(ref: str, folder: Path, trust: bool, what: str = "reference"):
    """The function named `module:function` (template-local modules only when trusted)."""
    module, _, func = ref.partition(":")
    local = local_module(folder, module)
    if local is not None:
        if not trust:
            raise TemplateError(f"the {what} {ref!r} is the template's own {local.name}: pass "
                                "--trust-template-code to run it (embedded mode only)")
        name = "_porter_tpl_" + hashlib.sha256(str(local.resolve()).encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(name, local)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    else:
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            raise TemplateError(f"the {what} {ref!r} cannot be imported here: {e}") from None
    fn = getattr(mod, func, None)
    if not callable(fn):
        raise TemplateError(f"the {what} {ref!r}: module {module} has no function {func}")
    return fn


def _defines(path: Path, name: str) -> bool:
    """Whether a Python file defines `name` at top level (read, never run)."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError, ValueError) as e:
        raise TemplateError(f"{path} cannot be read as Python: {e}") from None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and node.name == name:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return True
    return False


def check_function(ref: str, folder: Path, trust: bool, service: bool, what: str) -> None:
    """That `module:function` will be found where the job is measured, without running it
    here (the module may need torch, which a CPU submit machine may lack)."""
    module, _, func = ref.partition(":")
    local = local_module(folder, module)
    if local is not None:
        if service:
            raise TemplateError(f"the {what} {ref!r} is the template's own {local.name}; "
                                + SERVICE_REFUSAL)
        if not trust:
            raise TemplateError(f"the {what} {ref!r} is the template's own {local.name}: pass "
                                "--trust-template-code to run it (embedded mode only)")
        path = local
    else:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError) as e:
            spec, err = None, e
        else:
            err = None
        if spec is None:
            raise TemplateError(f"the {what} {ref!r} cannot be imported: no module {module!r} "
                                "here (install it, or name a built-in such as "
                                "porter.measure.ops.refs:softmax)" + (f"; {err}" if err else ""))
        path = Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    if path is not None and not _defines(path, func):
        raise TemplateError(f"the {what} {ref!r}: {path.name} defines no {func}")


def _param_kind(decl: str) -> tuple[str, str]:
    """('p' or 's', base type) of one C parameter declaration."""
    d = " ".join(decl.replace("__restrict__", " ").replace("const", " ").split())
    if "CUtensorMap" in d:
        return "m", "CUtensorMap"
    ptr = "*" in d or "[" in d
    words = d.replace("*", " ").split()
    base = " ".join(words[:-1]) if len(words) > 1 else (words[0] if words else "")
    return ("p" if ptr else "s"), base


def check_signature(tpl) -> None:
    """The kernel's parameters against the op's arguments: count, pointer or scalar, dtype."""
    from porter.interop.kt import kernel_parameters
    from porter.spec.opspec import DTYPES
    params = kernel_parameters(tpl.source, tpl.kernel)
    kinds = [_param_kind(p) for p in params]
    n_maps = len(tpl.tensor_maps)
    spec = tpl.op_spec
    if spec is not None:
        expected = [("p" if a.is_buffer or a.workspace else "s", a) for a in spec.kernel_args]
    else:
        from porter.measure.ops.base import _load
        cls = _load().get(tpl.op)
        if cls is None or cls.signature is None:
            return
        expected = [(k, None) for k in cls.signature]
    if len(kinds) != len(expected) + n_maps:
        names = ", ".join(a.name for _, a in expected if a is not None)
        raise TemplateError(
            f"kernel {tpl.kernel} of template {tpl.name!r} takes {len(kinds)} parameters but "
            f"the op {tpl.op!r} passes {len(expected)}" + (f" ({names})" if names else "")
            + (f" and {n_maps} tensor maps" if n_maps else "")
            + ": make [[op.args]] list the kernel's arguments in order")
    for i, ((kind, arg), (got, base)) in enumerate(zip(expected, kinds)):
        label = f"argument {i + 1}" + (f" ({arg.name})" if arg is not None else "")
        if kind != got:
            raise TemplateError(
                f"kernel {tpl.kernel}: {label} is declared as a "
                f"{'buffer' if kind == 'p' else 'scalar'} but the kernel takes "
                f"{params[i]!r}")
        if arg is not None and not arg.workspace and base not in ("void", "") \
                and base not in DTYPES[arg.dtype][1] and not _generic(base):
            raise TemplateError(f"kernel {tpl.kernel}: {label} is declared {arg.dtype} but the "
                                f"kernel takes {params[i]!r}")


def _generic(base: str) -> bool:
    # a template parameter, macro or typedef the check cannot resolve (T, real_t, ...)
    from porter.spec.opspec import DTYPES
    known = {c for _, cs in DTYPES.values() for c in cs}
    return base not in known and base not in ("void",)


def validate_template(tpl, trust_template_code: bool = False, service: bool = False) -> None:
    """Every op problem a user can fix, found before a job is recorded: an unknown op, a
    reference or baseline that cannot be imported where the job is measured (or that is the
    template's own code, refused by the service and run in embedded mode only when trusted),
    a kernel whose signature does not match the declared arguments."""
    from porter.measure.ops.base import _load
    folder = Path(tpl.folder)
    if service and (folder / "reference.py").is_file():
        raise TemplateError(f"template {tpl.name!r} carries reference.py; " + SERVICE_REFUSAL)
    spec = tpl.op_spec
    if spec is None:
        if tpl.op not in _load():
            raise TemplateError(f"template {tpl.name!r}: unknown op {tpl.op!r}; known: "
                                f"{', '.join(sorted(_load()))}, or declare the op in an [op] "
                                "section (docs/TEMPLATES.md)")
    else:
        for what in ("reference", "baseline"):
            ref = getattr(spec, what)
            if ref:
                check_function(ref, folder, trust_template_code, service, what)
        if spec.reference is None and tpl.tensor_maps:
            raise TemplateError(f"template {tpl.name!r}: a template with tensor maps needs a "
                                "reference function ([op] reference)")
    check_signature(tpl)
