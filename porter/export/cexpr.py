"""Space-file expressions as C: the `cu` export's host launcher computes the launch geometry at
the caller's problem size with the same expressions the search used."""
from __future__ import annotations

import ast
from typing import Mapping

from porter.errors import PorterError
from porter.spec.expr import Expr

_BIN = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "/", ast.Mod: "%",
        ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>"}
_CMP = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_FUNCS = {"min": "porter_min", "max": "porter_max", "abs": "porter_abs",
          "ceil_div": "porter_ceil_div", "round_up": "porter_round_up", "int": ""}

# the helpers the translated expressions call (64-bit integer arithmetic, as in the space file;
# `//` and `%` agree with Python's for the non-negative values geometry works with)
C_HELPERS = """[[maybe_unused]] static inline long long porter_min(long long a, long long b) { return a < b ? a : b; }
[[maybe_unused]] static inline long long porter_max(long long a, long long b) { return a > b ? a : b; }
[[maybe_unused]] static inline long long porter_abs(long long a) { return a < 0 ? -a : a; }
[[maybe_unused]] static inline long long porter_ceil_div(long long a, long long b) { return (a + b - 1) / b; }
[[maybe_unused]] static inline long long porter_round_up(long long a, long long b) {
  return porter_ceil_div(a, b) * b;
}
"""


def to_c(expr: Expr, consts: Mapping[str, int], variables: Mapping[str, str]) -> str:
    """`expr` as a C expression of type long long: names in `consts` become their values (the
    tuned parameters, the architecture's limits), names in `variables` the C names given (the
    problem sizes). Raises PorterError for what C cannot say the same way (true division,
    powers, membership tests)."""
    def go(node) -> str:
        match node:
            case ast.Constant(value=bool(v)):
                return "1" if v else "0"
            case ast.Constant(value=int(v)):
                return f"{v}LL"
            case ast.Name(id=name):
                if name in consts:
                    return f"{int(consts[name])}LL"
                if name in variables:
                    return f"(long long){variables[name]}"
                raise PorterError(f"expression {expr.text!r} names {name!r}, which the "
                                  "exported launcher does not know")
            case ast.BinOp(left=l, op=op, right=r) if type(op) in _BIN:
                return f"({go(l)} {_BIN[type(op)]} {go(r)})"
            case ast.UnaryOp(op=ast.USub(), operand=x):
                return f"(-{go(x)})"
            case ast.UnaryOp(op=ast.Not(), operand=x):
                return f"(!{go(x)})"
            case ast.BoolOp(op=op, values=vals):
                joiner = " && " if isinstance(op, ast.And) else " || "
                return "(" + joiner.join(go(v) for v in vals) + ")"
            case ast.Compare(left=l, ops=ops, comparators=comps) if all(
                    type(o) in _CMP for o in ops):
                parts, a = [], go(l)
                for o, c in zip(ops, comps):
                    b = go(c)
                    parts.append(f"({a} {_CMP[type(o)]} {b})")
                    a = b
                return "(" + " && ".join(parts) + ")"
            case ast.IfExp(test=t, body=b, orelse=o):
                return f"({go(t)} ? {go(b)} : {go(o)})"
            case ast.Call(func=ast.Name(id=fn), args=args) if fn in _FUNCS:
                return f"{_FUNCS[fn]}({', '.join(go(a) for a in args)})"
        raise PorterError(f"expression {expr.text!r} cannot be written in C for the exported "
                          "launcher (true division, powers and `in` are Python-only)")
    return go(expr._tree)
