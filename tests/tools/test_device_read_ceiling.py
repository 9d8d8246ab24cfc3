"""tools/device_read_ceiling.py: every read form reads every byte (under the interpreter), and the byte counts it
times are the DSv4 weights' (the timing itself runs on the device only)."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))

import device_read_ceiling as tool  # noqa: E402

from sglang_sm120.kernels import dsv4  # noqa: E402


@pytest.mark.parametrize("form", tool.READ_FORMS, ids=tool.label)
@pytest.mark.parametrize("n_int32", [1, 1023, 4097, 9000])
def test_each_read_form_xors_every_word(form, n_int32):
    gen = torch.Generator().manual_seed(n_int32)
    src = torch.randint(-2**31, 2**31 - 1, (n_int32,), dtype=torch.int32, generator=gen)
    out = torch.full((n_int32 // 1024 + 64,), 0x5A5A5A5A, dtype=torch.int32)  # poison: a skipped store shows
    call, programs = tool.read_call(torch, src, out, form, sms=3)
    call()
    assert tool.xor_all(torch, out[:programs]) == tool.xor_all(torch, src)


def test_xor_all_is_the_xor_of_every_word():
    words = [5, -1, 123456, -2**31, 7]
    expected = 0
    for w in words:
        expected ^= w
    assert tool.xor_all(torch, torch.tensor(words, dtype=torch.int32)) == expected
    assert tool.xor_all(torch, torch.tensor([], dtype=torch.int32)) == 0


def test_targets_are_every_dense_weight_and_the_b1_experts():
    rows = tool.targets(dsv4)
    for tp in tool.TPS:
        names = {name for name, t, _, _ in rows if t == tp}
        assert names == set(dsv4.dense_linear_shapes(tp)) | {"moe_b1_experts"}
    by_key = {(name, tp): nbytes for name, tp, nbytes, _ in rows}
    assert by_key["wo_b", 1] == 4096 * 8192 + 32 * 64 * 4  # fp8 bytes plus fp32 128x128 block scales
    # six experts' gate/up [2I, H] and down [H, I] in e2m1 (half a byte) plus one E8M0 byte per 32
    elements = 3 * 2048 * 4096
    assert by_key["moe_b1_experts", 1] == 6 * (elements // 2 + elements // 32)
