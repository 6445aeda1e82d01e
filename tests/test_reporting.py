"""The multi-rank suite's reporting (conftest.passed_counts over tests/mp/common.Checker's
output): a lost behaviour, a failed check and a silent rank each fail by name; a skipped check
(Checker.skip) is reported as skipped, never as passed."""

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


def skipping_rank(rank, world, skipped):
    """A rank's report whose every check was skipped (Checker.skip): (behaviour, case) pairs."""
    lines = [f"[rank {rank}] SKIP script(np={world}): [{b}] {case}" for b, case in skipped]
    behaviours = {}
    for b, _ in skipped:
        behaviours[b] = behaviours.get(b, 0) + 1
    lines += [f'[rank {rank}/{world}] behaviour "{b}": 0 passed, 0 failed, {n} skipped'
              for b, n in behaviours.items()]
    lines.append(f"[rank {rank}/{world}] script(np={world}): 0 checks passed, 0 failed, "
                 f"{len(skipped)} skipped")
    return "\n".join(lines)


def taken_skipped_checks(item):
    """The skipped checks passed_counts noted on this test (taken off: not listed in the run's
    summary, which would report a planted report's lines as this suite's)."""
    noted = [lines for key, lines in item.user_properties if key == "skipped checks"]
    item.user_properties[:] = [p for p in item.user_properties if p[0] != "skipped checks"]
    return noted


def test_a_skipped_check_is_not_a_passed_one(request):
    # rank 1 only arrives late (busy_wait.py): its behaviours ran, none of its checks passed; the
    # fewest passed is rank 0's, and the skips are noted for the summary
    late = [("all_reduce", "late peer: it only arrives late"), ("broadcast", "late peer: it only arrives late")]
    out = report(0, 2, GOOD) + "\n" + skipping_rank(1, 2, late)
    assert passed_counts(out, 2, {"all_reduce", "broadcast"}) == 14
    assert taken_skipped_checks(request.node) == [[
        "[all_reduce; broadcast] late peer: it only arrives late (rank 1)"]]
    # a rank that skipped some checks and passed others counts what it passed
    out = report(0, 2, GOOD) + "\n" + report(1, 2, [("all_reduce", 3, 0), ("broadcast", 4, 0)])
    out = out.replace('"all_reduce": 3 passed, 0 failed', '"all_reduce": 3 passed, 0 failed, 7 skipped')
    assert passed_counts(out, 2, {"all_reduce", "broadcast"}) == 7


def test_a_script_whose_every_check_was_skipped_is_skipped(request):
    out = skipping_rank(0, 1, [("point-to-point", "blocking send/recv: one rank: nothing to send")])
    with pytest.raises(pytest.skip.Exception, match=r"every check of every rank was skipped: "
                       r"\[point-to-point\] blocking send/recv: one rank: nothing to send \(rank 0\)"):
        passed_counts(out, 1, {"point-to-point"})
    # a failure elsewhere still fails: a skip never hides it
    bad = report(0, 2, [("point-to-point", 0, 1)], fail=("point-to-point", "wrong"))
    with pytest.raises(AssertionError, match="1 failed, e.g. wrong"):
        passed_counts(bad + "\n" + skipping_rank(1, 2, [("point-to-point", "x: y")]), 2)
    assert not taken_skipped_checks(request.node)


def test_checker_reports_a_skip_as_a_skip(checker_module, capsys, request):
    import torch
    c = checker_module.Checker("planted")
    c.section("checked")
    c.close("equal", torch.ones(2), torch.ones(2))
    c.section("not here")
    c.skip("subgroup all_reduce", "not a member")
    assert c.finish() == 0 and c.passed == 1 and not c.failures
    out = capsys.readouterr().out
    assert "[rank 0] SKIP planted: [not here] subgroup all_reduce: not a member" in out, out
    assert '[rank 0/1] behaviour "not here": 0 passed, 0 failed, 1 skipped' in out, out
    assert '[rank 0/1] behaviour "checked": 1 passed, 0 failed\n' in out, out
    assert "[rank 0/1] planted: 1 checks passed, 0 failed, 1 skipped" in out, out
    assert passed_counts(out, 1, {"checked", "not here"}) == 1
    assert taken_skipped_checks(request.node) == [["[not here] subgroup all_reduce: not a member (rank 0)"]]


# The reduction checker (tests/mp/common.py: reduction_bound with Checker.close) against planted
# defects: a result computed correctly in the dtype (rank by rank in issue order, and in reverse,
# each addition rounded as MPI's and our reducers round) passes; one that leaves out a rank's
# contribution, or divides an AVG by the wrong count, fails. Every float dtype, 2-5 ranks, the
# suite's own inputs.
@pytest.fixture(scope="module")
def checker_module():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent / "mp"))
    import common
    return common


def in_dtype(op, inputs, dtype, order, factor=None, divide_by=None):
    """What a backend computes: one rounding per step, in `order`."""
    if op == "product":
        acc = inputs[order[0]].clone()
        for r in order[1:]:
            acc = acc * inputs[r]
        return acc
    terms = [(inputs[r] * factor).to(dtype) if op == "premul_sum" else inputs[r] for r in order]
    acc = terms[0].clone()
    for t in terms[1:]:
        acc = acc + t
    return acc / divide_by if op == "avg" else acc


@pytest.mark.parametrize("world", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("op", ["sum", "avg", "premul_sum", "product"])
def test_reduction_checker_passes_right_answers_and_fails_planted_defects(checker_module, op,
                                                                          dtype, world):
    import torch
    common = checker_module
    dtype = getattr(torch, dtype)
    factor = 0.5 if op == "premul_sum" else None
    inputs = [common.make_input(77, r, 1000, dtype, "prod" if op == "product" else "any")
              for r in range(world)]
    expected, bound = common.reduced(op, inputs, dtype, factor)
    c = common.Checker("planted")
    everyone = list(range(world))
    for order in (everyone, everyone[::-1]):
        c.close(f"right, order {order}", in_dtype(op, inputs, dtype, order, factor, world),
                expected, dtype, bound=bound)
    assert not c.failures, c.failures
    defects = {f"rank {r} left out": in_dtype(op, inputs, dtype,
                                              [x for x in everyone if x != r], factor, world)
               for r in everyone}
    if op == "avg":
        defects["divided by p - 1"] = in_dtype(op, inputs, dtype, everyone, factor, world - 1)
    for name, wrong in defects.items():
        c = common.Checker("planted")
        c.close(name, wrong, expected, dtype, bound=bound)
        assert c.failures, f"{op} {dtype} at {world} ranks: '{name}' passed the checker"


def test_checker_compares_shapes_and_moved_data_exactly(checker_module):
    import torch
    c = checker_module.Checker("planted")
    c.close("shape", torch.ones(2, 3), torch.ones(6))
    c.close("one ulp off in a broadcast", torch.tensor([1.0]), torch.tensor([1.0 + 2 ** -23]))
    assert len(c.failures) == 2, c.failures


def test_deferred_device_reads_compare_later_under_their_section(checker_module, monkeypatch):
    # Checker(defer_device_reads=True), as collectives.py and device_soak.py run on a GPU: the
    # value checked is the one at close(), its verdict counts under the section close() ran in,
    # and every check queued is compared by the next section or finish. Host tensors stand in
    # for a device's here.
    import torch
    common = checker_module
    monkeypatch.setattr(common, "_deferrable", lambda t: isinstance(t, torch.Tensor))
    c = common.Checker("planted", defer_device_reads=True)
    c.section("first")
    got = torch.ones(3)
    c.close("wrong when checked", got, torch.zeros(3))
    got.zero_()  # changed after the check: must not rescue it
    c.close("right", torch.arange(4), torch.arange(4))
    assert not c.failures and c.passed == 0, "compared before the next section"
    c.section("second")
    assert c.behaviours["first"] == [1, 1], c.behaviours
    assert c.failures and c.failures[0].startswith("[first] wrong when checked"), c.failures
    c.close("wrong at finish", torch.ones(2), torch.full((2,), 2.0))
    assert c.finish() == 1
    assert c.behaviours["second"] == [0, 1], c.behaviours
    c = common.Checker("planted", defer_device_reads=True)
    c.DEFERRED_BYTES = 1  # past the queue's bound: compared at once
    c.close("over the bound", torch.ones(2), torch.zeros(2))
    assert len(c.failures) == 1, c.failures
