import pytest

from porter.errors import TemplateError
from porter.expr import Expr


def test_arithmetic_and_functions():
    e = Expr("ceil_div(M, BM) * BN if SPLIT > 1 else min(M, 3) + max(1, 2)")
    assert e.names == {"M", "BM", "BN", "SPLIT"}
    assert e({"M": 100, "BM": 64, "BN": 8, "SPLIT": 2}) == 16
    assert e({"M": 100, "BM": 64, "BN": 8, "SPLIT": 1}) == 5


def test_boolean_logic_short_circuits():
    assert Expr("X == 0 or 10 // X > 2")({"X": 0}) is True
    assert Expr("1 < X <= 4 and is_pow2(X)")({"X": 4}) is True
    assert Expr("1 < X <= 4 and is_pow2(X)")({"X": 3}) is False


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')", "x.real", "[i for i in range(3)]", "lambda: 1",
    "open('/etc/passwd')", "x[0]", "2 ** 1000000"])
def test_rejects_everything_outside_the_whitelist(text):
    with pytest.raises(TemplateError):
        Expr(text)({"x": 1})


def test_unknown_name_is_a_clear_error():
    with pytest.raises(TemplateError, match="names 'Q'"):
        Expr("Q + 1")({})
