"""tools/device_indexer_check.py: the exact top-k check and the listing of violations against the reference."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))

import device_indexer_check as tool  # noqa: E402


def _case(k=4):
    scores = torch.tensor([[5.0, 1.0, 4.0, 3.0, 2.0, 0.5, 6.0, 0.0],
                           [1.0, 2.0, 3.0, float("nan"), 0.0, 0.0, 0.0, 0.0]])
    scores[1, 3] = 9.0
    lens = torch.tensor([8, 3], dtype=torch.int32)  # row 1: 3 live positions, fewer than k
    raw = torch.tensor([[6, 0, 2, 3], [2, 1, 0, -1]], dtype=torch.int32)
    return scores, lens, raw, k


def test_a_true_top_k_has_no_violation():
    scores, lens, raw, k = _case()
    assert tool.exact_violations(raw, scores, lens, k) == 0


@pytest.mark.parametrize("row, col, value, why", [
    (0, 3, 4, "a slot below the k-th value (position 4 scores 2 < 3) and position 3 left out"),
    (0, 1, 6, "a repeated slot"),
    (1, 3, 4, "a slot where -1 padding belongs (row 1 has 3 live positions)"),
    (1, 2, -1, "-1 where a live position belongs"),
])
def test_each_kind_of_error_is_counted(row, col, value, why):
    scores, lens, raw, k = _case()
    raw[row, col] = value
    assert tool.exact_violations(raw, scores, lens, k) > 0, why


def test_a_tie_at_the_kth_value_may_go_either_way():
    scores = torch.tensor([[3.0, 2.0, 2.0, 1.0]])
    lens = torch.tensor([4], dtype=torch.int32)
    for second in (1, 2):
        assert tool.exact_violations(torch.tensor([[0, second]], dtype=torch.int32), scores, lens, 2) == 0


def test_reference_violations_list_both_scores():
    """The kernel picked position 1 over position 2 because its own logits put 1 higher: a violation against the
    reference, none against its own logits (the rounding case). Against the reference, position 1 lies below the k-th
    value (6, position 2's own score: an unselected position counts only above it); a position the reference puts
    above the k-th and the kernel left out is listed too."""
    ref = torch.tensor([[10.0, 5.0, 6.0, 1.0], [1.0, 2.0, 8.0, 9.0]])
    ours = torch.tensor([[10.0, 6.5, 6.0, 1.0], [8.75, 8.5, 8.0, 8.25]])
    lens = torch.tensor([4, 4], dtype=torch.int32)
    raw = torch.tensor([[0, 1], [0, 1]], dtype=torch.int32)
    assert tool.exact_violations(raw, ours, lens, 2) == 0
    listed = tool.reference_violations(raw, ref, ours, lens, 2)
    got = sorted((v["kind"], v["row"], v["pos"], v["ref"], v["ours"], v["ref_kth"], v["ours_kth"]) for v in listed)
    assert got == [("selected below the k-th", 0, 1, 5.0, 6.5, 6.0, 6.5),
                   ("selected below the k-th", 1, 0, 1.0, 8.75, 8.0, 8.5),
                   ("selected below the k-th", 1, 1, 2.0, 8.5, 8.0, 8.5),
                   ("unselected above the k-th", 1, 3, 9.0, 8.25, 8.0, 8.5)]
