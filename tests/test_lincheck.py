"""The checker itself, on histories whose answer is known."""
import math

from tests.lincheck import Op, linearizable, load, main, save


def test_sequential_history():
    assert linearizable([Op(0, 0, 1, "put", "a", True), Op(0, 2, 3, "get", None, "a")])


def test_stale_read_is_caught():
    assert not linearizable([Op(0, 0, 1, "put", "a", True), Op(0, 2, 3, "put", "b", True), Op(1, 4, 5, "get", None, "a")])


def test_concurrent_ops_may_order_either_way():
    ops = [Op(0, 0, 10, "put", "a", True), Op(1, 1, 9, "put", "b", True), Op(2, 11, 12, "get", None, "a")]
    assert linearizable(ops)


def test_two_cas_from_the_same_value_cannot_both_win():
    ops = [Op(0, 0, 1, "put", "x", True), Op(1, 2, 5, "cas", ("x", "y"), True), Op(2, 3, 6, "cas", ("x", "z"), True)]
    assert not linearizable(ops)


def test_unknown_outcomes_may_or_may_not_happen():
    lost = [Op(0, 0, 1, "put", "a", True), Op(1, 2, math.inf, "put", "b", None), Op(2, 3, 4, "get", None, "a")]
    assert linearizable(lost)
    happened = [Op(0, 0, 1, "put", "a", True), Op(1, 2, math.inf, "put", "b", None), Op(2, 3, 4, "get", None, "b")]
    assert linearizable(happened)
    flip = happened + [Op(2, 5, 6, "get", None, "a")]  # b took effect, then a came back: impossible
    assert not linearizable(flip)


def test_a_read_of_a_value_never_written_is_caught():
    assert not linearizable([Op(0, 0, 1, "get", None, "ghost")])


def test_a_saved_history_replays_to_the_same_verdict(tmp_path, capsys):
    good = [Op(0, 0, 1, "put", "a", True), Op(1, 2, math.inf, "cas", ("a", "b"), None), Op(2, 3, 4, "get", None, "b")]
    bad = good + [Op(2, 5, 6, "cas", ("b", "c"), False)]  # b is there, so this cas cannot fail
    for name, ops in (("good", good), ("bad", bad)):
        save(ops, tmp_path / f"{name}.json")
        assert load(tmp_path / f"{name}.json") == ops
    assert main([str(tmp_path / "good.json")]) == 0
    assert main([str(tmp_path / "good.json"), str(tmp_path / "bad.json")]) == 1
    assert "bad.json: 4 operations, NOT linearizable" in capsys.readouterr().out
