"""Triton kernels for DeepSeek-V4-Flash decode on sm_120, installed as ``sglang_sm120.kernels``.

Pure torch + Triton: nothing in this package imports SGLang, so every kernel can be tested and
benchmarked where SGLang cannot be installed (the CPU interpreter, a GPU box with another torch).
"""
