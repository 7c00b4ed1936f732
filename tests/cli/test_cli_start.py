"""The CLI's fast start, guarded without a clock (``bench/cli_start.py`` times it).

``labq CMD`` builds CMD's parser alone (``labq.cli.COMMANDS``, ``labq.cli.common.CommandSet``): the table must name
what the families register, and each command alone must parse and help as in the whole tree. ``labq submit`` and
``labq ls``, run to the end against a real socket, must not load what they do not use (``dataclasses``, ``typing``,
``tomllib``, ``shutil``, the daemons, the TUI...). A credentials file of the usual shape is read without ``tomllib``,
as ``tomllib`` reads it.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import import_module

import pytest
from hypothesis import given
from hypothesis import strategies as st

from labq.cli import COMMANDS, FAMILIES, _parser, main
from labq.cli.common import CommandSet, terminal_columns
from labq.credentials import credentials_text, load_credentials, save_credentials
from labq.plain_toml import plain_toml
from labq.protocol.codec import encode_job
from tests.cli.fake_leader import ROOT, FakeLeader, environment

#: what ``labq submit`` and ``labq ls`` over plain HTTP never load: libraries of other commands, and the
#: standard modules labq steps around (each costs milliseconds of a start that has about ten)
NOT_LOADED = ("textual", "rich", "docker", "zeroconf", "pynvml", "tinydb", "cryptography",
              "ssl", "http.client", "email", "tomllib", "dataclasses", "typing", "shutil", "textwrap", "pathlib",
              "encodings.idna", "socket", "selectors", "urllib.parse", "ipaddress", "gettext", "locale", "importlib", "unicodedata", "labq.models.job", "labq.protocol.checked", "labq.tls", "labq.scheduler",
              "labq.leader", "labq.agent", "labq.store", "labq.tui", "labq.sim", "labq.demo",
              "labq.cli.daemons", "labq.cli.admin", "labq.cli.tui", "labq.cli.sim", "labq.cli.store")


@pytest.fixture
def leader():
    fake = FakeLeader()
    yield fake
    fake.close()


@pytest.fixture(autouse=True)
def columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # help is laid out to the terminal's width: the same in every run


# -- one command's parser -------------------------------------------------------------------------

def registered(family: str) -> list[str]:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(action=CommandSet)
    import_module(f"labq.cli.{family}").add_commands(sub)
    return list(sub.choices)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_command_table_names_what_each_family_registers(family):
    assert registered(family) == list(FAMILIES[family])


def test_the_whole_tree_has_every_command_of_the_table_in_its_order():
    whole = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(whole.choices) == list(COMMANDS)


def parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser) of ``parser`` and every command under it, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from parsers(child, path + (name,))


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_command_built_alone_helps_as_in_the_whole_tree(name):
    whole = {path: p.format_help() for path, p in parsers(_parser()) if path[:1] == (name,)}
    alone = {path: p.format_help() for path, p in parsers(_parser(name)) if path[:1] == (name,)}
    assert alone == whole
    assert all(f"usage: labq {' '.join(path)}" in text for path, text in alone.items())


@pytest.mark.parametrize("name", ["submit", "ls", "cancel", "nodes", "admin", "store", "leader", "topo"])
def test_labq_command_help_exits_0(name, capsys):
    with pytest.raises(SystemExit) as done:
        main([name, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: labq {name}")


@pytest.mark.parametrize("argv", [
    ["submit", "--gpus", "2", "--class", "high", "--env", "A=1", "--", "python", "train.py", "--lr", "3"],
    ["ls", "--all", "--state", "running,queued", "--limit", "5", "--json"],
    ["cancel", "12", "13", "--yes"],
    ["admin", "token", "create", "alice", "--name", "laptop"],
    ["store", "check", "--json"],
])
def test_a_command_built_alone_parses_as_in_the_whole_tree(argv):
    assert _parser(argv[0]).parse_args(argv) == _parser().parse_args(argv)


def test_labq_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    listed = re.findall(r"^    (\S+)", out.split("\ncommands:\n", 1)[1].split("\n\n", 1)[0], re.M)
    assert listed == list(COMMANDS)


def test_an_unknown_command_is_refused_naming_them_all(capsys):
    with pytest.raises(SystemExit) as done:
        main(["sbumit", "--", "true"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "invalid choice: 'sbumit'" in err
    assert all(f"'{name}'" in err for name in COMMANDS)


@pytest.mark.parametrize("value", ["100", "33", "", "wide", "0", "-4"])
def test_help_is_as_wide_as_shutil_says(monkeypatch, value):
    monkeypatch.setenv("COLUMNS", value)
    assert terminal_columns() == shutil.get_terminal_size().columns


# -- what a command loads -------------------------------------------------------------------------

PROBE = """
import contextlib, io, json, sys
before = set(sys.modules)
from labq.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main({argv!r})
print(json.dumps({{"code": code, "out": out.getvalue(), "loaded": sorted(set(sys.modules) - before)}}))
"""


def run_probe(argv: list[str], home, leader: FakeLeader) -> dict:
    """``labq ARGV`` in a fresh interpreter as a person with a credentials file in ``home``: its exit code, what it
    printed and the modules it loaded beyond the interpreter's own start."""
    env = environment({"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")})
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    save_credentials(leader.url, "lqu_secret", home / ".config" / "labq" / "credentials")
    out = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True,
                         timeout=60, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_submit_loads_no_heavy_module(leader, tmp_path, jobs):
    leader.json("POST", "/v1/jobs", {"job": encode_job(jobs.queued())})
    seen = run_probe(["submit", "--", "true"], tmp_path, leader)
    assert (seen["code"], seen["out"]) == (0, "submitted job 1\n")
    assert [r["body"]["command"] for r in leader.sent("POST", "/v1/jobs")] == [["true"]]
    assert {"labq.cli.jobs", "labq.client", "labq.protocol.requests", "_socket"} <= set(seen["loaded"])
    assert not {"labq.cli.views", "labq.cli.actions"} & set(seen["loaded"])  # only submit's parser is built
    assert sorted(set(NOT_LOADED) & set(seen["loaded"])) == []


def test_ls_loads_no_heavy_module(leader, tmp_path, jobs):
    job = jobs.queued(priority=300)
    leader.json("GET", "/v1/jobs", {"jobs": [encode_job(job)], "pending": {str(job.id): None}})
    seen = run_probe(["ls"], tmp_path, leader)
    assert seen["code"] == 0 and re.search(rf"^{job.id}\s.*\bqueued\s+high\b", seen["out"], re.M)
    assert leader.sent("GET", "/v1/jobs")
    assert {"labq.cli.views", "labq.render", "labq.client", "_socket"} <= set(seen["loaded"])
    assert sorted(set(NOT_LOADED) & set(seen["loaded"])) == []


# -- credentials without tomllib ------------------------------------------------------------------

@pytest.mark.parametrize(("text", "doc"), [
    ('leader = "http://gpu1:7733"\ntoken = "lqu_abc-DEF_1"\n',
     {"leader": "http://gpu1:7733", "token": "lqu_abc-DEF_1"}),
    ('# labq\n\n  token="t"  \n\tpin = "sha256:00ff"', {"token": "t", "pin": "sha256:00ff"}),
    ('token = ""\n', {"token": ""}),
    ("", {}),
])
def test_a_plain_credentials_file_is_read_as_tomllib_reads_it(text, doc):
    assert plain_toml(text.encode()) == doc == tomllib.loads(text)


@pytest.mark.parametrize("text", [
    'token = "a\\"b"\n',  # an escape
    'token = "x" # mine\n',  # a comment after the value
    "token = 'x'\n",  # a literal string
    'token = "x"\r\n',  # CRLF
    '[labq]\ntoken = "x"\n',  # a table
    'a.b = "x"\n',  # a dotted key
    'token = "x"\ntoken = "y"\n',  # twice: tomllib refuses it
    'token = "\u00e9"\n',  # not ASCII
    'token = "x\x01"\n',  # a control character
    'gpus = 4\n',  # not a string
    'token = "x\n',  # unterminated
])
def test_any_other_file_is_left_to_tomllib(text):
    assert plain_toml(text.encode()) is None


@given(st.text(alphabet='ab-_.=" #\\\'[]\t\r\n\x00\u00e9', max_size=40))
def test_plain_toml_never_reads_a_file_otherwise_than_tomllib(text):
    doc = plain_toml(text.encode())
    if doc is not None:
        assert doc == tomllib.loads(text)


@given(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e, blacklist_characters='"\\'),
               max_size=30))
def test_what_labq_writes_is_read_without_tomllib(token):
    text = credentials_text("http://gpu1:7733", token, "sha256:" + "0f" * 32)
    assert plain_toml(text.encode()) == tomllib.loads(text) == {"leader": "http://gpu1:7733", "token": token,
                                                                 "pin": "sha256:" + "0f" * 32}


def test_a_credentials_file_tomllib_must_read_is_still_read(tmp_path):
    path = tmp_path / "credentials"
    path.write_text('token = "tok\\"en"  # escaped\nleader = "http://gpu1:7733"\n')
    assert load_credentials(path) == {"token": 'tok"en', "leader": "http://gpu1:7733"}


def test_a_credentials_file_that_is_not_utf8_is_named(tmp_path):
    from labq.protocol.errors import ApiError

    path = tmp_path / "credentials"
    path.write_bytes(b'token = "\xff"\n')
    with pytest.raises(ApiError, match=f"cannot read {path}"):
        load_credentials(path)
