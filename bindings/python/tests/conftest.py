"""Shared setup: which stria is under test, and a bound on every wait inside the library."""

from __future__ import annotations

import os

import pytest
import stria

# Every context the tests create fails a stuck collective after this many seconds rather than the
# library's default 300, so a broken test ends by itself.
TIMEOUT_S = 60.0


def pytest_report_header(config):
    return f"stria {stria.__version__} from {os.path.dirname(stria.__file__)} (library {stria.library_version()})"


def pytest_sessionstart(session):
    # The install check (scripts/test-python.sh) runs the suite against the installed wheel.
    expected = os.environ.get("STRIA_EXPECT_PACKAGE_DIR")
    if expected and os.path.realpath(os.path.dirname(stria.__file__)) != os.path.realpath(expected):
        pytest.exit(f"testing stria from {stria.__file__}, expected it from {expected}", returncode=3)


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(1234)


@pytest.fixture
def ucx(monkeypatch):
    """Skips where this build has no UCX transport. The process environment has no STRIA_ROOT or
    STRIA_SECRET of its own unless a test sets them."""
    monkeypatch.setenv("STRIA_ROOT", "127.0.0.1:1")  # a world of 1 listens nowhere
    try:
        stria.Context(transport="ucx", timeout_s=TIMEOUT_S).close()
    except stria.UnsupportedError as e:
        pytest.skip(f"no UCX transport: {e}")
    monkeypatch.delenv("STRIA_ROOT")
    monkeypatch.delenv("STRIA_SECRET", raising=False)


def torch_or_skip():
    """torch, or a skip when it is not installed, unless STRIA_REQUIRE_TORCH=1 (the test script
    sets it: there a missing torch is a failure, not a skip)."""
    try:
        import torch
    except ImportError:
        if os.environ.get("STRIA_REQUIRE_TORCH") == "1":
            raise
        pytest.skip("torch is not installed")
    return torch
