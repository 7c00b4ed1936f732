"""One rule for names (labq.protocol.names), and every parse function that takes a name uses it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from labq.leader.config import ConfigError
from labq.leader.config_file import load_config
from labq.protocol.agents import parse_registration
from labq.protocol.bookings import parse_reserve
from labq.protocol.errors import ApiError
from labq.protocol.names import check_name, name_problem, user_name_problem
from labq.protocol.requests import parse_submit, parse_user

BAD = ["evil\n", "x\r", "tab\there", "nul\x00", "bell\x07", "del\x7f", "csi\x9b", "rtl\u202e", "zw\u200b", "nbsp\xa0",
       "a b", " ", "", "x" * 129, "../x", "-rf", ".hidden", "sur\ud800", "line\u2028"]
GOOD = ["ws1", "train-resnet.v2", "alice@lab", "a+b", "_svc", "0", "x" * 128, "gpu-node-07.lab.example.org"]


@pytest.mark.parametrize("value", BAD, ids=ascii)
def test_bad_names_are_refused_with_a_sentence(value):
    problem = name_problem(value, "job name")
    assert problem is not None and problem.startswith("job name")
    assert problem.isprintable()


@pytest.mark.parametrize("value", GOOD)
def test_plain_names_pass(value):
    assert name_problem(value, "node name") is None
    assert check_name(value, "node name", "node") == value


def test_control_characters_are_named_as_such():
    assert name_problem("evil\n", "job name") == "job name 'evil\\n' contains a control character (U+000A)"
    assert "unprintable" in name_problem("rtl\u202e", "job name")


@pytest.mark.parametrize("value", [None, 7, ["a"], {"a": 1}])
def test_names_that_are_not_strings(value):
    assert name_problem(value, "group name") == "group name must be a string"


@given(st.text(max_size=200))
def test_an_accepted_name_is_one_printable_line_of_plain_characters(value):
    if name_problem(value, "name") is None:
        assert value.isprintable() and value.isascii() and value.strip() == value and 0 < len(value) <= 128
        assert value == value.splitlines()[0]


def test_user_names_are_unix_style_on_top():
    assert user_name_problem("alice") is None and user_name_problem("_svc.1") is None
    assert "Unix-style" in user_name_problem("Alice")
    assert "Unix-style" in user_name_problem("a" * 33)
    assert "control character" in user_name_problem("alice\n")


def test_check_name_raises_the_protocols_400():
    with pytest.raises(ApiError) as caught:
        check_name("x\n", "node name", "node")
    assert (caught.value.status, caught.value.field) == (400, "node")


# -- every parse function that takes a name ----------------------------------------------------


def refused(parse, body) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse(body)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize("field", ["name", "node", "reservation"])
@pytest.mark.parametrize("value", ["evil\n", "evil\r\n", "a\x1b[31m"], ids=ascii)
def test_submit_names(field, value):
    err = refused(parse_submit, {"command": ["true"], field: value})
    assert err.field == field and "control character" in err.message


def test_a_user_named_with_a_newline_is_refused():
    err = refused(parse_user, {"name": "alice\n"})
    assert err.field == "name" and "control character" in err.message
    assert parse_user({"name": "alice"}).name == "alice"


def node_doc(name: str) -> dict:
    return {"name": name, "gpus": [{"index": 0, "uuid": "SIM-0", "model": "RTX 3090", "memory_mib": 24576}],
            "topology": {"pcie": [[0]], "nvlinks": [[0]], "nvswitch_links": [], "numa": []},
            "unmanaged_busy": [], "simulated": True, "labels": []}


def test_a_node_named_with_a_newline_cannot_register():
    err = refused(parse_registration, {"node": node_doc("x\n"), "version": "1"})
    assert err.field == "node.name" and "control character" in err.message
    assert parse_registration({"node": node_doc("x"), "version": "1"}).node.name == "x"


@pytest.mark.parametrize("inventory", [
    {"gpus": "many"}, {"gpus": [{"index": 0}]}, {"gpus": [{"index": 1, "uuid": "u", "model": "m", "memory_mib": 1}]},
    {"topology": {"pcie": [[7]], "nvlinks": [[0]]}}, {"topology": {"pcie": [[0, 0]], "nvlinks": [[0]]}},
    {"unmanaged_busy": [[1]]}, {"labels": ["a\nb"]}, {"health": "exploded"}, {"simulated": "yes"},
    {"gpus": [{"index": 0, "uuid": "u", "model": "m", "memory_mib": "24 GB"}]}, {"colour": "red"},
], ids=str)
def test_an_inventory_of_the_wrong_shape_is_a_400(inventory):
    doc = {**node_doc("ws1"), **inventory}
    assert refused(parse_registration, {"node": doc, "version": "1"}).field.startswith("node")


@pytest.mark.parametrize(("field", "value"), [("name", "r\n"), ("node", "n\n"), ("group", "g\n"), ("owner", "o\n"),
                                              ("users", ["alice\n"])], ids=str)
def test_reservation_names(field, value):
    err = refused(parse_reserve, {"gpus": 1, "start": 1, "end": 2, field: value})
    assert err.field == field


def test_group_names_in_the_leaders_config(tmp_path):
    path = tmp_path / "leader.toml"
    path.write_text('[groups]\n"nlp\\n" = ["alice"]\n')
    with pytest.raises(ConfigError, match="group name 'nlp\\\\n' contains a control character"):
        load_config(path)
    path.write_text('[groups]\nnlp = ["alice\\n"]\n')
    with pytest.raises(ConfigError, match="user name 'alice\\\\n' contains a control character"):
        load_config(path)
    path.write_text('[groups]\nnlp = ["alice", "bob"]\n[scheduling]\nnon_preemptible_users = ["*"]\n')
    config = load_config(path)
    assert config.groups == {"nlp": ("alice", "bob")} and config.non_preemptible_users == ("*",)


def test_allow_root_is_a_documented_jobs_key(tmp_path):
    path = tmp_path / "leader.toml"
    assert load_config(None).allow_root is False
    path.write_text("[jobs]\nallow_root = true\n")
    assert load_config(path).allow_root is True
    path.write_text('[jobs]\nallow_root = "yes"\n')
    with pytest.raises(ConfigError, match="jobs.allow_root = 'yes': must be true or false"):
        load_config(path)
    from labq.leader.default_config import DEFAULT_TOML
    assert "\nallow_root = false " in DEFAULT_TOML


def test_the_request_limits_are_read(tmp_path):
    path = tmp_path / "leader.toml"
    path.write_text('[leader]\nrequest_timeout = "3s"\nmax_connections_per_address = 16\n')
    config = load_config(path)
    assert (config.request_timeout_s, config.max_connections_per_address) == (3.0, 16)
    path.write_text("[leader]\nmax_connections_per_address = 0\n")
    with pytest.raises(ConfigError, match="must be positive"):
        load_config(path)
