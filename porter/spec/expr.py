"""A safe evaluator for the expressions in space files and Kernel Tuner T1 files.

Template text never reaches Python's eval: expressions are parsed with `ast` and checked
against a whitelist of node types (arithmetic, comparison, boolean logic, conditional expression,
calls to a fixed table of functions, and for T1 files list/generator comprehensions with
conditions, subscripts and slices). A checked tree is then compiled (the tree, not the text)
and run with no builtins, its free names resolving only against the mapping passed in: that
made enumerating a large space (gemm_wgmma: 829,440 configurations, every constraint) some ten
times faster than walking the tree. Trees that can grow without bound (`**`, `<<`,
comprehensions, sequence functions such as `range`, sequences multiplied) are walked instead,
and the walk bounds them: at most MAX_ITEMS elements in any sequence, MAX_BITS bits in any
integer, MAX_STEPS evaluation steps and MAX_SECONDS of time; past a bound a TemplateError says
which. Any failure of a compiled run is replayed by the walk for its error message.
"""
from __future__ import annotations

import ast
import math
import operator
import time
from functools import lru_cache
from typing import Any, Mapping

from porter.errors import TemplateError

MAX_ITEMS = 1_000_000        # elements in any one sequence (a range, a list, a comprehension)
MAX_BITS = 4096              # bits in any integer
MAX_STEPS = 20_000_000       # evaluation steps of one expression
MAX_SECONDS = 2.0            # wall time of one expression


class _Bound(TemplateError):
    pass


def _ceil_div(a, b):
    return -(-a // b)


def _is_pow2(x):
    return x > 0 and (x & (x - 1)) == 0


def _seq(x, what: str) -> tuple:
    if isinstance(x, range):
        if len(x) > MAX_ITEMS:
            raise _Bound(f"{what} would have {len(x)} elements (at most {MAX_ITEMS})")
        return tuple(x)
    if isinstance(x, (tuple, list, str)):
        if len(x) > MAX_ITEMS:
            raise _Bound(f"{what} would have {len(x)} elements (at most {MAX_ITEMS})")
        return tuple(x)
    raise TypeError(f"{what} needs a sequence, not {type(x).__name__}")


def _range(*args):
    if not all(isinstance(a, int) and not isinstance(a, bool) for a in args):
        raise TypeError("range takes integers")
    return _seq(range(*args), "range")


def _sorted(x, *rest):
    if rest:
        raise TypeError("sorted takes one sequence")
    return tuple(sorted(_seq(x, "sorted")))


def _minmax(fn):
    def f(*args):
        return fn(_seq(args[0], fn.__name__) if len(args) == 1 else args)
    f.__name__ = fn.__name__
    return f


SCALAR_FUNCTIONS = {
    "min": _minmax(min), "max": _minmax(max), "abs": abs, "ceil_div": _ceil_div,
    "is_pow2": _is_pow2, "log2": lambda x: math.log2(x), "int": int,
    "round_up": lambda a, b: _ceil_div(a, b) * b, "float": float, "bool": bool,
    "round": round, "ceil": math.ceil, "floor": math.floor, "sqrt": math.sqrt,
}
# functions of sequences or that make them: their trees are walked (and bounded)
SEQUENCE_FUNCTIONS = {
    "range": _range, "list": lambda x=(): _seq(x, "list"), "tuple": lambda x=(): _seq(x, "tuple"),
    "len": lambda x: len(_seq(x, "len")), "sum": lambda x, s=0: sum(_seq(x, "sum"), s),
    "sorted": _sorted, "any": lambda x: any(_seq(x, "any")), "all": lambda x: all(_seq(x, "all")),
    "reversed": lambda x: tuple(reversed(_seq(x, "reversed"))),
}
FUNCTIONS = {**SCALAR_FUNCTIONS, **SEQUENCE_FUNCTIONS}
_BIN = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Div: operator.truediv, ast.Mod: operator.mod,
    ast.Pow: operator.pow, ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
    ast.BitXor: operator.xor, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
}
_CMP = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_,
          ast.Invert: operator.invert}
_ALLOWED = (ast.Constant, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Tuple,
            ast.List, ast.Load, ast.Store, ast.operator, ast.unaryop, ast.cmpop, ast.boolop,
            ast.ListComp, ast.GeneratorExp, ast.comprehension, ast.Subscript, ast.Slice)
_GROWING = (ast.ListComp, ast.GeneratorExp, ast.Subscript, ast.Slice)

_GLOBALS = {"__builtins__": {}, **SCALAR_FUNCTIONS}


class Expr:
    """A parsed expression: `names` are the free names it reads."""

    __slots__ = ("text", "_tree", "names", "_code")

    def __init__(self, text: str | int | float):
        self.text = str(text)
        try:
            tree = ast.parse(self.text.strip(), mode="eval")
        except SyntaxError as e:
            raise TemplateError(f"cannot parse expression {self.text!r}: {e.msg}") from None
        self._tree = tree.body
        self.names = frozenset(_check(self._tree, self.text))
        self._code = compile(tree, "<space>", "eval") if _compilable(tree) else None

    def __getstate__(self):      # code objects do not pickle: templates go to compile workers
        return self.text

    def __setstate__(self, text):
        self.__init__(text)

    def __call__(self, env: Mapping[str, Any]) -> Any:
        if self._code is not None:
            try:
                return eval(self._code, _GLOBALS, env)  # noqa: S307 - a whitelisted tree
            except Exception:  # noqa: BLE001 - the walk gives the same result or a clear error
                pass
        return _Walk(env, self.text).eval(self._tree)

    def walk(self, env: Mapping[str, Any]) -> Any:
        """Always the bounded walk: for environments whose names may hold sequences (a T1
        size expression reads each parameter's list of values)."""
        return _Walk(env, self.text).eval(self._tree)

    def __repr__(self) -> str:
        return f"Expr({self.text!r})"


@lru_cache(maxsize=4096)
def parse(text: str) -> Expr:
    return Expr(text)


def _compilable(tree: ast.AST) -> bool:
    """Whether a compiled run is bounded by the text alone: no powers, shifts, comprehensions,
    subscripts, sequence functions or sequence literals in `+` / `*`. (A free name may still
    hold a sequence: callers that pass sequences, such as T1 size environments, use walk.)"""
    for n in ast.walk(tree):
        if isinstance(n, _GROWING):
            return False
        if isinstance(n, ast.Call) and n.func.id in SEQUENCE_FUNCTIONS:
            return False
        if isinstance(n, ast.BinOp):
            if isinstance(n.op, (ast.Pow, ast.LShift)):
                return False
            if isinstance(n.op, (ast.Mult, ast.Add)) and (_literal_sequence(n.left)
                                                          or _literal_sequence(n.right)):
                return False
    return True


def _literal_sequence(n: ast.AST) -> bool:
    return isinstance(n, (ast.List, ast.Tuple)) or (isinstance(n, ast.Constant)
                                                    and isinstance(n.value, str))


def _check(node: ast.AST, text: str) -> set[str]:
    """Rejects any node outside the whitelist; returns the free names (comprehension targets
    are bound, not free)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            if not isinstance(sub.func, ast.Name) or sub.func.id not in FUNCTIONS or sub.keywords:
                raise TemplateError(f"expression {text!r} calls something other than "
                                    f"{', '.join(sorted(FUNCTIONS))}")
        elif not isinstance(sub, (ast.Name, *_ALLOWED)):
            raise TemplateError(f"expression {text!r} uses {type(sub).__name__}, "
                                "which space files do not allow")
        if isinstance(sub, ast.Constant) and not isinstance(sub.value, (int, float, bool, str)):
            raise TemplateError(f"expression {text!r} has a constant of an unsupported type")
        if isinstance(sub, ast.BinOp) and type(sub.op) not in _BIN:
            raise TemplateError(f"expression {text!r} uses an unsupported operator")
        if isinstance(sub, ast.comprehension):
            if sub.is_async or not all(isinstance(t, ast.Name) for t in ast.walk(sub.target)
                                       if not isinstance(t, (ast.Tuple, ast.Store))):
                raise TemplateError(f"expression {text!r}: a comprehension may only bind names")
    return _free(node, frozenset())


def _free(node: ast.AST, bound: frozenset) -> set[str]:
    if isinstance(node, ast.Name):
        return set() if node.id in bound or node.id in FUNCTIONS else {node.id}
    if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
        out, inner = set(), bound
        for gen in node.generators:
            out |= _free(gen.iter, inner)
            inner = inner | {t.id for t in ast.walk(gen.target) if isinstance(t, ast.Name)}
            for cond in gen.ifs:
                out |= _free(cond, inner)
        return out | _free(node.elt, inner)
    out = set()
    for child in ast.iter_child_nodes(node):
        if isinstance(node, ast.Call) and child is node.func:
            continue
        out |= _free(child, bound)
    return out


class _Walk:
    """One bounded evaluation of a checked tree."""

    def __init__(self, env: Mapping[str, Any], text: str):
        self.env, self.text, self.steps = env, text, 0
        self.deadline = time.monotonic() + MAX_SECONDS
        self.scopes: list[dict] = []

    def fail(self, why: str):
        raise TemplateError(f"expression {self.text!r}: {why}")

    def tick(self):
        self.steps += 1
        if self.steps % 4096 == 0:
            if self.steps > MAX_STEPS:
                self.fail(f"more than {MAX_STEPS} evaluation steps")
            if time.monotonic() > self.deadline:
                self.fail(f"took longer than {MAX_SECONDS:g} s")

    def lookup(self, name: str):
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        if name in self.env:
            return self.env[name]
        raise TemplateError(f"expression {self.text!r} names {name!r}, which is not a "
                            "parameter, problem size or architecture limit")

    def eval(self, node: ast.AST) -> Any:
        try:
            return self._eval(node)
        except _Bound as e:
            self.fail(str(e))
        except TemplateError:
            raise
        except (TypeError, ValueError, ZeroDivisionError, IndexError, OverflowError) as e:
            self.fail(f"{type(e).__name__}: {e}")

    def _eval(self, node: ast.AST) -> Any:  # noqa: C901 - one case per node type
        self.tick()
        ev = self._eval
        match node:
            case ast.Constant(value=v):
                return v
            case ast.Name(id=name):
                return self.lookup(name)
            case ast.BinOp(left=l, op=op, right=r):
                return self.binop(op, ev(l), ev(r))
            case ast.UnaryOp(op=op, operand=x):
                return _UNARY[type(op)](ev(x))
            case ast.BoolOp(op=op, values=vals):
                result = isinstance(op, ast.And)
                for v in vals:
                    result = ev(v)
                    if bool(result) != isinstance(op, ast.And):
                        return result
                return result
            case ast.Compare(left=l, ops=ops, comparators=comps):
                a = ev(l)
                for op, c in zip(ops, comps):
                    b = ev(c)
                    if not _CMP[type(op)](a, b):
                        return False
                    a = b
                return True
            case ast.IfExp(test=t, body=b, orelse=o):
                return ev(b) if ev(t) else ev(o)
            case ast.Tuple(elts=elts) | ast.List(elts=elts):
                return tuple(ev(e) for e in elts)
            case ast.Call(func=ast.Name(id=fn), args=args):
                return FUNCTIONS[fn](*(ev(a) for a in args))
            case ast.ListComp(elt=elt, generators=gens) | ast.GeneratorExp(elt=elt,
                                                                           generators=gens):
                out: list = []
                self.scopes.append({})
                try:
                    self.comprehend(elt, gens, 0, out)
                finally:
                    self.scopes.pop()
                return tuple(out)
            case ast.Subscript(value=v, slice=s):
                seq = ev(v)
                if isinstance(s, ast.Slice):
                    lo, hi, st = (None if x is None else ev(x) for x in (s.lower, s.upper, s.step))
                    return _seq(seq, "a slice")[lo:hi:st]
                return _seq(seq, "a subscript")[ev(s)]
        self.fail("cannot be evaluated")

    def comprehend(self, elt, gens, i: int, out: list):
        if i == len(gens):
            out.append(self._eval(elt))
            if len(out) > MAX_ITEMS:
                raise _Bound(f"a comprehension would have more than {MAX_ITEMS} elements")
            return
        gen = gens[i]
        for item in _seq(self._eval(gen.iter), "a comprehension"):
            self.bind(gen.target, item)
            if all(self._eval(c) for c in gen.ifs):
                self.comprehend(elt, gens, i + 1, out)

    def bind(self, target, value):
        if isinstance(target, ast.Name):
            self.scopes[-1][target.id] = value
            return
        vals = _seq(value, "unpacking")
        if len(vals) != len(target.elts):
            raise ValueError(f"cannot unpack {len(vals)} values into {len(target.elts)} names")
        for t, v in zip(target.elts, vals):
            self.bind(t, v)

    def binop(self, op, a, b):
        if isinstance(op, ast.Pow) and isinstance(b, (int, float)) and not isinstance(a, tuple):
            if abs(b) > 64 and abs(a) > 1:
                raise _Bound("exponent too large")
            if isinstance(a, int) and isinstance(b, int) and b > 0 and \
                    abs(a).bit_length() * b > MAX_BITS:
                raise _Bound(f"a power past {MAX_BITS} bits")
        if isinstance(op, ast.LShift) and isinstance(b, int) and b > MAX_BITS:
            raise _Bound(f"a shift past {MAX_BITS} bits")
        if isinstance(op, ast.Mult):
            seq, n = (a, b) if isinstance(a, (tuple, str)) else (b, a)
            if isinstance(seq, (tuple, str)) and isinstance(n, int) and len(seq) * n > MAX_ITEMS:
                raise _Bound(f"a repeated sequence would have more than {MAX_ITEMS} elements")
        r = _BIN[type(op)](a, b)
        if isinstance(r, int) and r.bit_length() > MAX_BITS:
            raise _Bound(f"a number past {MAX_BITS} bits")
        if isinstance(r, (tuple, str)) and len(r) > MAX_ITEMS:
            raise _Bound(f"a sequence of more than {MAX_ITEMS} elements")
        return r


def _eval(node: ast.AST, env: Mapping[str, Any], text: str) -> Any:
    """The walk of a checked tree (what a compiled run falls back to)."""
    return _Walk(env, text).eval(node)
