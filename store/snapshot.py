"""The snapshot file's bytes (``labq.json`` and its previous copy): canonical JSON whose ``_meta`` carries a
checksum of the rest, made by ``encode`` and checked by ``decode``."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from labq.store.contract import META, CorruptDatabase, SchemaMismatch
from labq.store.hot import PREFIX, SCHEMA, stamp
from labq.store.journal import dumps

_CHECKSUM = re.compile(rb'"checksum":"([0-9a-f]{64})",')


def encode(data: dict) -> bytes:
    """The file's bytes: canonical JSON whose ``_meta`` carries a checksum of the rest."""
    data[META]["1"].pop("checksum", None)
    return stamp(dumps(data))


def decode(raw: bytes, path: Path) -> dict:
    """Parse and check a database file; raise with what is wrong. Never writes.

    Damage is raised without advice (``hint``): what to do depends on the rest of the data
    folder (is the previous copy sound?), which the caller adds with ``recover_hint``.
    """
    if not raw.strip():
        raise CorruptDatabase(f"{path} is empty ({len(raw)} bytes): it was cut off or never written")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CorruptDatabase(f"{path} is not text (a byte that is not UTF-8 at {err.start} of {len(raw)}): "
                              f"it is damaged") from None
    try:
        data = json.loads(text)
    except ValueError as err:
        raise CorruptDatabase(f"{path} is not valid JSON ({err.msg}; character {err.pos} of {len(text)}): "
                              f"it is truncated or damaged") from None
    try:
        meta = data[META]["1"]
        schema = meta["schema"]
    except (KeyError, TypeError):
        raise CorruptDatabase(f"{path} is not a labq database: it has no {META} table") from None
    # The checksum first: a changed digit in the schema number is damage, not another labq.
    meta.pop("checksum", None)
    mark = _CHECKSUM.match(raw, len(PREFIX)) if raw.startswith(PREFIX) else None
    body = PREFIX + raw[mark.end():] if mark else b""
    if mark is None or mark.group(1).decode() != hashlib.sha256(body).hexdigest():
        if schema == SCHEMA:
            raise CorruptDatabase(f"{path} fails its checksum: it was changed or damaged on disk")
        raise CorruptDatabase(
            f"{path} may be damaged: its schema number reads {schema!r} (this labq reads schema {SCHEMA}) "
            f"and it fails its checksum, so a changed character is likelier than another labq version "
            f"(if another version did write it, use that version instead of recovering)")
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise SchemaMismatch(f"{path} has an unknown schema {schema!r}",
                             "Nothing was changed. Open it with the labq version that wrote it.")
    if schema > SCHEMA:
        raise SchemaMismatch(
            f"{path} was written by a newer labq (schema {schema}); this labq reads schema {SCHEMA}",
            "Nothing was changed. Upgrade labq on this machine to the version that wrote it.")
    if schema < SCHEMA:
        raise SchemaMismatch(f"{path} has schema {schema}, older than any this labq can read ({SCHEMA})",
                             "Nothing was changed. Open it with the labq version that wrote it.")
    for key in ("seq", "next_job_id", "ids_reserved_until"):
        if not isinstance(meta.get(key), int):
            raise CorruptDatabase(f"{path}: {META} has no integer {key}")
    return data
