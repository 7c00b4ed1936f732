"""The HTTP API's reference (``docs/api.md``) lists the submit body's fields as their one declaration has them."""

from __future__ import annotations

import re
from pathlib import Path

from labq.models.spec import SENT
from labq.spec_text import fields_table

API = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def test_the_submit_fields_in_the_api_reference_are_the_declared_ones():
    text = API.read_text()
    block = re.search(r"<!-- the submit fields: labq.spec_text.fields_table\(\) -->\n(.*?)<!-- end of the submit "
                      r"fields -->", text, re.S)
    assert block is not None, "docs/api.md lost its table of the submit fields"
    assert block.group(1) == fields_table(), "docs/api.md is behind labq.models.spec: paste in fields_table()"
    listed = re.findall(r"^\| `([a-z_]+)` \|", block.group(1), re.M)
    assert listed == [f.name for f in SENT] and "shm_size_mib" in listed
