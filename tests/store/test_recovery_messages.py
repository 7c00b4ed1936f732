"""What labq says about a damaged data folder, and that every suggestion it makes works when followed.

A flipped digit in the schema number must read as damage (with how to check and recover), not as a
newer labq; with both copies damaged, labq must not suggest a ``--recover`` that then refuses: it
names the backup restore and where the archive and the previous copy are.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from labq.store import CorruptDatabase, SchemaMismatch, StoreError, TinyDBStore, plan_recovery
from labq.store.tinydb_store import DB_NAME, PREVIOUS_NAME
from tests.e2e.conftest import Lab, lab  # noqa: F401  (the fixture)
from tests.store.conftest import small_lab

pytestmark = pytest.mark.timeout(120)


def flip_schema_digit(path: Path) -> None:
    """One bit of the schema number flips on disk: '1' (0x31) becomes '3' (0x33)."""
    raw = path.read_bytes()
    assert raw.count(b'"schema":1,') == 1
    path.write_bytes(raw.replace(b'"schema":1,', b'"schema":3,'))


def damage(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])


@pytest.fixture
def data(tmp_path) -> Path:
    return small_lab(tmp_path / "data")


def labq(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labq.cli", *args], capture_output=True, text=True, timeout=60,
                          env=env)


# -- a flipped schema digit --------------------------------------------------------------------


def test_a_flipped_schema_digit_is_reported_as_damage_with_how_to_check_and_recover(data):
    flip_schema_digit(data / DB_NAME)
    with pytest.raises(CorruptDatabase) as refused:
        TinyDBStore(data)
    text = str(refused.value)
    assert "may be damaged" in text and "schema number reads 3" in text
    assert f"labq store check --data-dir {data}" in text
    assert f"labq leader --recover --data-dir {data}" in text


def test_a_real_newer_schema_still_says_upgrade(data):
    from labq.store.tinydb_store import encode

    doc = json.loads((data / DB_NAME).read_bytes())
    doc["_meta"]["1"]["schema"] = 3
    (data / DB_NAME).write_bytes(encode(doc))  # whole, checksummed: a newer labq wrote it
    with pytest.raises(SchemaMismatch, match=re.escape("written by a newer labq (schema 3)")) as refused:
        TinyDBStore(data)
    assert "Upgrade labq" in str(refused.value) and "damaged" not in str(refused.value)


def test_following_the_flipped_schema_advice_checks_and_recovers(data):
    flip_schema_digit(data / DB_NAME)
    checked = labq("store", "check", "--data-dir", str(data))
    assert checked.returncode == 1
    assert re.search(r"DAMAGED labq\.json .*may be damaged", checked.stdout), checked.stdout
    assert re.search(r"ok +labq\.json\.prev", checked.stdout), checked.stdout
    assert f"labq store recover --data-dir {data}" in checked.stdout
    recovered = labq("store", "recover", "--data-dir", str(data), "--yes")
    assert recovered.returncode == 0, recovered.stderr
    with TinyDBStore(data) as store:
        assert sorted(store.load().jobs) == [2, 3]  # the previous copy and the journal after it: nothing lost


# -- both copies damaged -----------------------------------------------------------------------


def assert_names_the_restore_not_recover(text: str, data: Path) -> None:
    assert "--recover" not in text and "labq store recover" not in text, text
    assert f"labq store restore BACKUP --data-dir {data} --force" in text, text
    assert str(data / "archive") in text and str(data / PREVIOUS_NAME) in text, text


def test_with_both_copies_damaged_the_store_names_the_backup_not_recover(data):
    damage(data / DB_NAME)
    damage(data / PREVIOUS_NAME)
    with pytest.raises(CorruptDatabase) as refused:
        TinyDBStore(data)
    assert_names_the_restore_not_recover(str(refused.value), data)
    with pytest.raises(StoreError) as no_plan:
        plan_recovery(data)
    assert_names_the_restore_not_recover(str(no_plan.value), data)


def test_with_the_previous_copy_missing_the_store_names_the_backup_not_recover(data):
    damage(data / DB_NAME)
    (data / PREVIOUS_NAME).unlink()
    with pytest.raises(CorruptDatabase) as refused:
        TinyDBStore(data)
    assert_names_the_restore_not_recover(str(refused.value), data)
    checked = labq("store", "check", "--data-dir", str(data))
    assert checked.returncode == 1
    assert_names_the_restore_not_recover(checked.stdout, data)


def test_following_the_both_damaged_advice_restores_the_lab(lab):  # noqa: F811
    from labq.credentials import credentials_path, load_credentials

    lab.start_leader()
    saved = credentials_path(lab.home)  # the leader saves them just after it says it serves
    lab.wait(lambda: "token" in load_credentials(saved), "the first admin's credentials")
    kept = lab.submit("sleep", "300", gpus=1)
    lab.labq("cancel", str(lab.submit("true")))
    backup = lab.root / "backup"
    lab.labq("store", "backup", str(backup), "--data-dir", str(lab.data))
    lab.kill(lab.leader, signal.SIGTERM)
    damage(lab.data / DB_NAME)
    damage(lab.data / PREVIOUS_NAME)

    leader = ["leader", "--no-mdns", "--config", str(lab.config), "--data-dir", str(lab.data)]
    refused = lab.labq(*leader, check=False)
    assert refused.returncode == 2
    assert_names_the_restore_not_recover(refused.stderr, lab.data)
    leader_recover = lab.labq(*leader, "--recover", "--yes", check=False)
    assert leader_recover.returncode == 2 and "previous copy is damaged too" in leader_recover.stderr
    assert_names_the_restore_not_recover(leader_recover.stderr, lab.data)
    store_recover = lab.labq("store", "recover", "--data-dir", str(lab.data), "--yes", check=False)
    assert store_recover.returncode != 0
    assert_names_the_restore_not_recover(store_recover.stderr, lab.data)
    checked = lab.labq("store", "check", "--data-dir", str(lab.data), check=False)
    assert checked.returncode == 1
    assert_names_the_restore_not_recover(checked.stdout, lab.data)

    # follow it, word for word
    command = re.search(r"labq store restore BACKUP --data-dir \S+ --force", refused.stderr).group(0)
    restored = lab.labq(*command.replace("BACKUP", str(backup)).split()[1:])
    assert "replaced" in restored.stdout
    lab.start_leader()
    assert lab.job(kept)["state"] == "queued"
