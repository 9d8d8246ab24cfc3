"""Prefill-decode disaggregation for sm_120 boxes over NIXL.

``topology``: what the machines are (GPU model, P2P matrix, NICs), from a file, flags or detection.
``planner``: turns a topology and a prefill/decode split into exact SGLang server and router
commands with the NIXL/UCX settings for that topology, each with its reason.
``launcher``: starts a plan's processes, waits for health, streams logs, tears down cleanly.
``kvlayout``: DSv4-Flash KV pool regions and NIXL descriptors as SGLang's NIXL connector builds them.
``nixl_check``: a two-process NIXL transfer of DSv4-shaped KV pools, every byte checked.
``cli``: the ``pd plan`` / ``pd launch`` subcommands and the PD section of ``doctor``.

Nothing here imports SGLang at import time, so the planner runs on any machine.
"""
