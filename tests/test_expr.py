import pytest

from porter.errors import TemplateError
from porter.spec.expr import Expr


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
    "__import__('os').system('true')", "x.real", "{i: i for i in range(3)}", "lambda: 1",
    "open('/etc/passwd')", "x[0]", "2 ** 1000000"])
def test_rejects_everything_outside_the_whitelist(text):
    with pytest.raises(TemplateError):
        Expr(text)({"x": 1})


def test_unknown_name_is_a_clear_error():
    with pytest.raises(TemplateError, match="names 'Q'"):
        Expr("Q + 1")({})


def test_compiled_and_walked_evaluation_agree():
    from porter.spec.expr import _eval
    texts = ["ceil_div(M, BM) * BN if SPLIT > 1 else min(M, 3) + max(1, 2)",
             "X == 0 or 10 // X > 2", "1 < X <= 4 and is_pow2(X)", "X in (1, 2, 4)",
             "not X or -X < 3", "round_up(M, 64) // 8 % 5", "M / 3 >= 2.5"]
    for text in texts:
        e = Expr(text)
        assert e._code is not None
        for env in ({"M": 100, "BM": 64, "BN": 8, "SPLIT": 2, "X": 0},
                    {"M": 7, "BM": 3, "BN": 1, "SPLIT": 1, "X": 4}):
            assert e(env) == _eval(e._tree, env, text), (text, env)


def test_a_name_that_is_not_in_the_mapping_cannot_reach_python():
    # no builtins in a compiled run: a free name never resolves to len, open, ...
    with pytest.raises(TemplateError, match="names 'len'"):
        Expr("len + 1")({})
    with pytest.raises(TemplateError, match="names 'M'"):
        Expr("ceil_div(M, 2)")({})
    assert Expr("2 ** X")._code is None            # powers are walked: the walk bounds them
    assert Expr("2 ** X")({"X": 10}) == 1024


def test_expressions_pickle():
    import pickle
    e = pickle.loads(pickle.dumps(Expr("ceil_div(M, BM) * 2")))
    assert e({"M": 100, "BM": 64}) == 4 and e.names == {"M", "BM"}
