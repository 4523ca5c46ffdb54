"""Op harnesses: what a template computes, which inputs it gets, its reference and its vendor
baseline. Harness code runs only inside the measuring child process (it imports CuPy)."""
from __future__ import annotations

from porter.measure.ops.base import Op, get_op, make_op, op_names, register  # noqa: F401
from porter.measure.ops.resolve import validate_template  # noqa: F401
