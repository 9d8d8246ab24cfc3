"""Fixtures shared by the seam tests."""

import pytest

from sglang_sm120.seams import REGISTRY


@pytest.fixture
def install_seam():
    """Put a seam into the plugin's registry for one test; returns ``decide(environ) -> seam``, which
    decides and installs it the way ``register()`` does on a GPU-less machine. The registry is
    restored afterwards."""
    replaced = []

    def add(seam):
        replaced.append((seam.name, REGISTRY._seams.get(seam.name)))
        REGISTRY.add(seam)

        def decide(environ):
            seam.state = None
            REGISTRY.apply_all(environ=environ, gpu=(False, "no CUDA device"))
            return seam

        return decide

    yield add
    for name, previous in reversed(replaced):
        if previous is not None:
            REGISTRY.add(previous)
        else:
            REGISTRY._seams.pop(name, None)
