"""Fixtures shared by the autocast tests."""

from __future__ import annotations

import contextlib

import pytest


@pytest.fixture
def without_known_calls(monkeypatch):
    """A context in which ``autocast`` recognises no call: every equation under its rule."""
    from heddle.programs import _known

    @contextlib.contextmanager
    def context():
        with monkeypatch.context() as m:
            m.setattr(_known, "calls", lambda *a, **k: None)
            yield

    return context
