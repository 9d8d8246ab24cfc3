#!/usr/bin/env python3
"""Compile every registered Triton kernel config for sm_120a and sm_121a on a machine with no GPU
and report MMA opcodes, shared memory against 101376 B, registers and spills.

Same as ``sglang-sm120 aot-check`` (arguments: --arch N, --only SUBSTRING, --json FILE)."""

import sys

from sglang_sm120.cli import main

if __name__ == "__main__":
    sys.exit(main(["aot-check", *sys.argv[1:]]))
