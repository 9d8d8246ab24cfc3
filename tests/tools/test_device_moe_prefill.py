"""tools/device_moe_prefill.py: tile labels given on its command line (``--gate-up``, ``--down``, ``--partners``)
name exactly the tiles the forward runs, register cap and byte planes included."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))

import device_moe_prefill as tool  # noqa: E402

from sglang_sm120.kernels import moe_prefill as mp  # noqa: E402


@pytest.mark.parametrize("cfg", [mp.DEFAULT_GATE_UP, mp.DEFAULT_DOWN, mp.SMALL_ROWS_TILE,
                                 mp.PrefillConfig(128, 64, 64, 8, 3, 128), mp.PrefillConfig(64, 32, 128, 4, 2, 168),
                                 *mp.BYTE_PLANE_CANDIDATES["gate_up"], mp.PrefillConfig(128, 64, 128, 8, 2, 128, True)],
                         ids=lambda cfg: cfg.label())
def test_labels_round_trip(cfg):
    assert tool.parse_label(cfg.label()) == cfg


@pytest.mark.parametrize("label", ["m128n64k64w8", "m128n64k64w8s3r", "128n64k64w8s3", "m128n64k64w8s3r128x",
                                   "m128n64k64w8s3pr128"])
def test_malformed_labels_are_refused(label):
    with pytest.raises(SystemExit, match="not a tile label"):
        tool.parse_label(label)
