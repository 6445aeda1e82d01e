"""The multi-rank suite's reporting (conftest.passed_counts over tests/mp/common.Checker's
output): a lost behaviour, a failed check and a silent rank each fail by name."""

import pytest

from conftest import passed_counts


def report(rank, world, behaviours, fail=None):
    lines = []
    if fail:
        lines.append(f"[rank {rank}] FAIL script(np={world}): [{fail[0]}] {fail[1]}")
    for name, passed, failed in behaviours:
        lines.append(f'[rank {rank}/{world}] behaviour "{name}": {passed} passed, {failed} failed')
    total_p = sum(p for _, p, _ in behaviours)
    total_f = sum(f for _, _, f in behaviours)
    lines.append(f"[rank {rank}/{world}] script(np={world}): {total_p} checks passed, "
                 f"{total_f} failed")
    return "\n".join(lines)


GOOD = [("all_reduce", 10, 0), ("broadcast", 4, 0)]


def test_every_rank_every_behaviour_passes():
    out = report(0, 2, GOOD) + "\n" + report(1, 2, GOOD)
    assert passed_counts(out, 2, {"all_reduce", "broadcast"}) == 14


def test_a_behaviour_that_stopped_running_fails_by_name():
    out = report(0, 2, GOOD[:1]) + "\n" + report(1, 2, GOOD[:1])
    with pytest.raises(AssertionError, match="behaviour 'broadcast': did not run on any rank"):
        passed_counts(out, 2, {"all_reduce", "broadcast"})


def test_a_behaviour_missing_on_one_rank_names_the_rank():
    out = report(0, 2, GOOD) + "\n" + report(1, 2, GOOD[:1])
    with pytest.raises(AssertionError, match="behaviour 'broadcast', rank 1: did not run"):
        passed_counts(out, 2, {"all_reduce", "broadcast"})


def test_an_unexpected_behaviour_fails():
    out = report(0, 1, GOOD + [("gather", 1, 0)])
    with pytest.raises(AssertionError, match="'gather': ran but is not expected"):
        passed_counts(out, 1, {"all_reduce", "broadcast"})


def test_a_failed_check_names_behaviour_rank_and_case():
    bad = [("all_reduce", 9, 1), ("broadcast", 4, 0)]
    out = report(0, 2, GOOD) + "\n" + report(1, 2, bad, fail=("all_reduce", "sum int8 n=7: 3 differ"))
    with pytest.raises(AssertionError,
                       match=r"behaviour 'all_reduce', rank 1: 1 failed, e.g. sum int8 n=7: 3 differ"):
        passed_counts(out, 2, {"all_reduce", "broadcast"})


def test_a_silent_rank_fails():
    with pytest.raises(AssertionError, match=r"no report from rank\(s\) \[1, 2\] of 3"):
        passed_counts(report(0, 3, GOOD), 3)
