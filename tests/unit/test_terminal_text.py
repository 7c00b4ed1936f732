"""``escape_controls`` and ``EscapingFormatter``: nothing from a user reaches a terminal or a log raw."""

from __future__ import annotations

import io
import logging
import sys
import unicodedata

import pytest

from labq.log_text import EscapingFormatter
from labq.terminal_text import HIDDEN_CATEGORIES, escape_controls


@pytest.mark.parametrize(("raw", "shown"), [
    ("resnet50", "resnet50"),
    ("evil\n", "evil\\n"),
    ("a\r\nb\tc", "a\\r\\nb\\tc"),
    ("\x1b[2Jwiped", "\\x1b[2Jwiped"),  # clear screen
    ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),  # window title
    ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
    ("ab\x08\x08cd", "ab\\x08\\x08cd"),  # backspace over what was printed
    ("del\x7f", "del\\x7f"),
    ("c1\x85\x9b2J", "c1\\x85\\x9b2J"),  # NEL and the one-byte CSI
    ("\x00nul", "\\x00nul"),
    ("alice\u202egnp.exe", "alice\\u202egnp.exe"),  # right-to-left override
    ("\u2066isolate\u2069", "\\u2066isolate\\u2069"),
    ("bob\u200b", "bob\\u200b"),  # zero-width space: two names that look alike
    ("a\ufeffb", "a\\ufeffb"),
    ("line\u2028sep\u2029para", "line\\u2028sep\\u2029para"),
    ("tag\U000e0041", "tag\\U000e0041"),  # a tag character, invisible
    ("lone\ud800", "lone\\ud800"),  # a surrogate no terminal encoding can print
    ("学生の実験 🚀", "学生の実験 🚀"),  # CJK and emoji stay readable
    ("naïve café ñ", "naïve café ñ"),
    ("[red]x[/red] [link=http://e.vil]y[/link]", "[red]x[/red] [link=http://e.vil]y[/link]"),  # markup: Text's job
    ("C:\\new\\table", "C:\\new\\table"),  # backslashes are not escaped
    ("", ""),
])
def test_escapes_what_a_terminal_would_act_on_and_nothing_else(raw, shown):
    assert escape_controls(raw) == shown


def test_escaped_text_is_one_line_and_escaping_again_changes_nothing():
    raw = "x\n\x1b[2J\u202e\u2028y"
    once = escape_controls(raw)
    assert "\n" not in once and once.isprintable()
    assert escape_controls(once) == once


def test_any_value_becomes_text():
    assert escape_controls(12) == "12"
    assert escape_controls(["a\n"]) == "['a\\n']"


def test_keep_leaves_the_named_characters_raw():
    assert escape_controls("one\ntwo\x1b[2J\r", keep="\n") == "one\ntwo\\x1b[2J\\r"


def test_every_code_point_is_either_kept_or_escaped_to_printable_ascii():
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        shown = escape_controls(char)
        if unicodedata.category(char) in HIDDEN_CATEGORIES:
            assert shown.startswith("\\") and shown.isascii() and shown.isprintable(), (hex(code), shown)
        else:
            assert shown == char, hex(code)


# -- logs -----------------------------------------------------------------------------------------------

@pytest.fixture
def log():
    """A logger writing through ``EscapingFormatter`` to a string."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(EscapingFormatter("%(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("labq.test.escaping")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    yield logger, out
    logger.removeHandler(handler)


def test_a_log_line_quoting_a_user_stays_one_line_with_no_raw_control_character(log):
    logger, out = log
    logger.info("job %d (%s) of %s started", 7, "evil\nINFO labq.leader: job 8 cancelled", "alice\x1b]0;x\x07")
    logger.warning("name %r and %s", "\u202egnp", {"k": "v\r\x1b[2J"})
    lines = out.getvalue().splitlines()
    assert lines == [
        "INFO labq.test.escaping: job 7 (evil\\nINFO labq.leader: job 8 cancelled) of alice\\x1b]0;x\\x07 started",
        "WARNING labq.test.escaping: name '\\u202egnp' and {'k': 'v\\r\\x1b[2J'}",
    ]


def test_a_traceback_keeps_its_lines_and_loses_its_control_characters(log):
    logger, out = log
    try:
        raise ValueError("bad name \x1b[2J\u202e")
    except ValueError:
        logger.exception("refused %s", "x\ny")
    text = out.getvalue()
    assert text.startswith("ERROR labq.test.escaping: refused x\\ny\nTraceback (most recent call last):\n")
    assert text.rstrip("\n").endswith("ValueError: bad name \\x1b[2J\\u202e")
    assert all(line.isprintable() for line in text.splitlines())


def test_a_traceback_another_formatter_cached_raw_is_escaped_too(log):
    logger, out = log
    plain = io.StringIO()
    first = logging.StreamHandler(plain)
    first.setFormatter(logging.Formatter("%(message)s"))
    logger.handlers.insert(0, first)  # formats first, and caches the raw traceback on the record
    try:
        try:
            raise RuntimeError("\x1b[31mboom")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(first)
    assert "\x1b" in plain.getvalue()
    assert "\x1b" not in out.getvalue() and "RuntimeError: \\x1b[31mboom" in out.getvalue()
