"""Adding a field to a job's spec is one declaration, shown rather than claimed.

In a fresh interpreter, ``labq.models.spec`` is loaded from its own source with one more ``Field`` written into
``FIELDS``, and nothing else changed. The new field must then be in ``labq submit --help``, in the body the CLI
builds, in the leader's checks (bounds refused, naming the field), through a real TinyDB store and back, and in
the order an agent receives.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: the one line a new field costs (its use aside)
DECLARATION = ('    Field("dust_level", "int | None", None, kind="count", low=0, high=9, flag="--dust-level", '
               'metavar="N", help="how dusty the GPUs may be (0-9)"),\n')

PROBE = textwrap.dedent('''
    import contextlib, importlib.util, io, json, os, re, sys, tempfile
    os.environ["COLUMNS"] = "200"  # one flag's help on one line

    import labq.models
    source = open({spec!r}).read()
    end = source.index("\\n)\\n\\nBY_NAME")
    source = source[:end + 1] + {declaration!r} + source[end + 1:]
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("labq.models.spec", loader=None))
    sys.modules["labq.models.spec"] = module
    exec(compile(source, {spec!r}, "exec"), module.__dict__)

    from labq.cli import _parser, main
    from labq.cli.jobs import build_submit_body
    from labq.models.job import JobSpec
    from labq.protocol.agents import RunOrder, SyncReply, decode_reply, encode_reply
    from labq.protocol.codec import decode_job, encode_job
    from labq.protocol.errors import ApiError
    from labq.protocol.requests import parse_submit
    from labq.models.job import Job
    from labq.store import PutJob, TinyDBStore

    seen = {{}}
    help = io.StringIO()
    with contextlib.redirect_stdout(help):
        try:
            main(["submit", "--help"])
        except SystemExit:
            pass
    seen["help"] = re.search(r"--dust-level N +how dusty the GPUs may be \\(0-9\\)", help.getvalue()) is not None
    args = _parser("submit").parse_args(["submit", "--dust-level", "3", "--", "true"])
    body = build_submit_body(args, environ={{}}, cwd="/tmp")
    seen["body"] = body.get("dust_level")
    spec = parse_submit(json.loads(json.dumps(body))).spec_for("alice")
    seen["spec"] = spec.dust_level
    seen["default"] = JobSpec("alice", ("true",)).dust_level
    try:
        parse_submit({{"command": ["true"], "dust_level": 10}})
    except ApiError as err:
        seen["refused"] = [err.field, err.message]
    with tempfile.TemporaryDirectory() as folder:
        with TinyDBStore(folder) as store:
            store.commit([PutJob(encode_job(Job(7, spec, submitted_at=1.0)))])
        with TinyDBStore(folder) as store:
            seen["stored"] = decode_job(store.load().jobs[7]).spec.dust_level
    order = RunOrder(7, 1, spec, {{}}, (0,), ("SIM-0",), None)
    wire = json.loads(json.dumps(encode_reply(SyncReply((order,), (), 30.0, 600.0))))
    seen["order"] = decode_reply(wire).run[0].spec.dust_level
    print(json.dumps(seen))
''')


def test_a_field_declared_once_reaches_the_cli_the_request_the_checks_the_store_and_the_agent():
    spec = ROOT / "labq" / "models" / "spec.py"
    assert "dust_level" not in spec.read_text()  # the field exists only in the probe
    code = PROBE.format(spec=str(spec), declaration=DECLARATION)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"help": True, "body": 3, "spec": 3, "default": None,
                    "refused": ["dust_level", "dust_level must be between 0 and 9, not 10"], "stored": 3, "order": 3}


def test_the_probe_fails_without_the_declaration():
    """The probe proves the declaration's work: with no field added, it cannot find one."""
    spec = ROOT / "labq" / "models" / "spec.py"
    code = PROBE.format(spec=str(spec), declaration="")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode != 0 and "dust" in out.stderr
