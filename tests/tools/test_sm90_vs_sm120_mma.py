"""tools/sm90_vs_sm120_mma.py: the opcode families and K-loop facts it reports, on synthetic SASS rows (the
compilation itself is the AOT harness's, tested with the registry)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))

import sm90_vs_sm120_mma as tool  # noqa: E402


def _rows(ops):
    """(address, opcode, rest) rows as sass_lines gives them; a BRA's rest names its target address."""
    return [(16 * i, op, rest) for i, (op, rest) in enumerate(ops)]


def test_families_name_warpgroup_and_thread_mma_apart():
    rows = _rows([("HGMMA.64x128x16.F32.BF16", ""), ("HMMA.16816.F32.BF16", ""), ("FFMA", ""),
                  ("QMMA.SF.16832.F32.E4M3.E4M3.E8", "")])
    assert tool.mma_families(rows) == ["HGMMA", "HMMA", "QMMA"]
    assert tool.mma_families(_rows([("FFMA", ""), ("LDG.E.128", "")])) == []


def test_loop_facts_count_the_innermost_mma_loop():
    rows = _rows([("MOV", ""),                       # 0x00, before the loops
                  ("HMMA.16816.F32.BF16", ""),       # 0x10  outer loop start
                  ("MOV", ""),                       # 0x20  inner loop start
                  ("HMMA.16816.F32.BF16", ""),       # 0x30
                  ("MOV", ""),                       # 0x40
                  ("BRA", " 0x20"),                  # 0x50  inner back-branch
                  ("BRA", " 0x10"),                  # 0x60  outer back-branch
                  ("EXIT", "")])
    assert tool.loop_facts(rows) == {"loop_instructions": 4, "loop_mma": 1, "loop_mov": 2}
    assert tool.loop_facts(_rows([("FFMA", ""), ("BRA", " 0x0")])) == {"loop_instructions": 0, "loop_mma": 0,
                                                                       "loop_mov": 0}


def test_markdown_lists_every_record_and_marks_different_mma():
    records = [{"config": "a_kernel", "sm90": {"families": ["HGMMA"], "loop_instructions": 100, "loop_mma": 4,
                                               "loop_mov": 0},
                "sm120": {"families": ["HMMA"], "loop_instructions": 200, "loop_mma": 16, "loop_mov": 50},
                "different_mma": True, "loop_ratio": 2.0},
               {"config": "b_kernel", "sm90": {"families": ["HMMA"], "loop_instructions": 90, "loop_mma": 8,
                                               "loop_mov": 0},
                "sm120": {"families": ["HMMA"], "loop_instructions": 92, "loop_mma": 8, "loop_mov": 3},
                "different_mma": False, "loop_ratio": 1.02}]
    text = tool.markdown(records, "title")
    rows = [line for line in text.splitlines() if line.startswith("| a_kernel") or line.startswith("| b_kernel")]
    assert rows == ["| a_kernel | HGMMA | 100 (4, 0) | HMMA | 200 (16, 50) | 2.0 **(different MMA)** |",
                    "| b_kernel | HMMA | 90 (8, 0) | HMMA | 92 (8, 3) | 1.02 |"]
    assert text.startswith("# title\n")
