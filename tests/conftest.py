"""Shared pytest fixtures."""

import logging

import pytest


@pytest.fixture(autouse=True)
def _root_log_handlers_restored():
    """Tests that call ``engine.cli.main`` in-process install a root handler on pytest's captured
    stderr (logging.basicConfig); drop it after the test so later logging does not write to a closed stream."""
    root = logging.getLogger()
    before = list(root.handlers)
    yield
    for h in [h for h in root.handlers if h not in before]:
        root.removeHandler(h)
