from calc import mean


def test_mean_of_integers():
    assert mean([2, 4, 6]) == 4


def test_mean_is_not_truncated():
    assert mean([1, 2]) == 1.5
