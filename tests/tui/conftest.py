"""The TUI tests' fixtures, defined in ``labs.py`` with what else the tests share."""

from tests.tui.labs import canned_leader, lab, own_lab, shared_lab  # noqa: F401 - fixtures
