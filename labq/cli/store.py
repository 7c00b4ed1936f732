"""``labq store``: check, recover, back up and restore the leader's data folder.

Thin: parse, call one function of ``labq.store``, print. Imports stay lazy, as in ``labq.cli``.
"""

from __future__ import annotations

import argparse
import json
import sys

from labq.cli.common import path_arg
from labq.cli.errors import CliError

STORE_EPILOG = """\
examples:
  labq store check                        is the database sound?
  labq store backup /mnt/backups/labq-$(date +%F)   a consistent copy, while the leader runs
  labq store restore /mnt/backups/labq-2025-01-31   into a data folder, with its leader stopped
  labq store recover                      back to the last sound state of a damaged database
"""


def add_commands(sub: argparse._SubParsersAction) -> None:
    store = sub.add_parser("store", help="check, back up, restore or recover the leader's database",
                           epilog=STORE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                           description="Look after the leader's data folder. `check` and `backup` work while "
                           "the leader runs; `restore` and `recover` need it stopped.")
    store_sub = store.add_subparsers(title="store commands", metavar="COMMAND")
    check = store_sub.add_parser("check", help="report on the database without changing anything",
                                 description="Read the database, its previous copy, the journals and the archive; change "
                                 "nothing. Exits 1 if the database or a journal is damaged.")
    recover = store_sub.add_parser(
        "recover", help="go back to the last sound state of a damaged database",
        description="Make the last sound state (a sound copy of the database and the journal up to the damage) "
        "the database, after saying what will be lost. The damaged files are kept beside it, renamed.")
    backup = store_sub.add_parser(
        "backup", help="copy the lab into a folder, consistently, even while the leader runs",
        description="Write a complete copy of the lab (the database as of one commit, the archive of finished "
        "jobs up to that commit, the join token) into DIR, a new or empty folder, with a manifest "
        "(time, labq version, schema, commit, files with sizes and sha256), then read it back and check it. "
        "The leader keeps serving meanwhile.")
    backup.add_argument("dest", type=path_arg, metavar="DIR", help="a new or empty folder")
    restore = store_sub.add_parser(
        "restore", help="put a backup into a data folder (the leader stopped)",
        description="Check a backup against its manifest, then make it the lab in the data folder. Refuses while "
        "a leader runs on that folder, and refuses to replace a lab there unless --force; the replaced files "
        "are moved into DATA_DIR/replaced-<time>/. Job ids continue past those the backed-up leader had reserved.")
    restore.add_argument("source", type=path_arg, metavar="DIR", help="a folder written by labq store backup")
    restore.add_argument("--force", action="store_true",
                         help="replace the lab in the data folder (its files are moved aside, not deleted)")
    for p in (check, recover, backup, restore):
        p.add_argument("--data-dir", type=path_arg, default=None, metavar="DIR",
                       help="the leader's data folder (default: $LABQ_DATA_DIR or ~/.local/share/labq)")
    for p in (check, backup, restore):
        p.add_argument("--json", action="store_true", help="print JSON")
    check.set_defaults(run=_check)
    recover.add_argument("--yes", action="store_true", help="do not ask before recovering")
    recover.set_defaults(run=_recover)
    backup.set_defaults(run=_backup)
    restore.set_defaults(run=_restore)
    store.set_defaults(run=lambda args: (store.print_help(), 0)[1])


def _data_dir(args: argparse.Namespace):
    from labq.paths import default_data_dir

    return args.data_dir or default_data_dir()


def _existing_data_dir(args: argparse.Namespace):
    data_dir = _data_dir(args)
    if not data_dir.is_dir():
        raise CliError(f"{data_dir} is not a folder: no leader has used it yet (or give --data-dir)")
    return data_dir


def _check(args: argparse.Namespace) -> int:
    from labq.store.check import check_data_dir, recover_hint
    from labq.store.data_folder import PREVIOUS_NAME

    data_dir = _existing_data_dir(args)
    reports = check_data_dir(data_dir)
    sound = all(r.ok for r in reports if r.name != PREVIOUS_NAME)  # the previous copy is a spare
    if args.json:
        print(json.dumps({"data_dir": str(data_dir), "files": [r.as_dict() for r in reports]}, indent=2))
    else:
        print(f"data folder {data_dir}")
        for r in reports:
            print(f"  {'ok     ' if r.ok else 'DAMAGED'} {r.name:<16} {r.detail}")
        if not sound:
            print("\n" + recover_hint(data_dir, checked=True))
    return 0 if sound else 1


def _recover(args: argparse.Namespace) -> int:
    from labq.store import StoreError, plan_recovery, recover

    data_dir = _data_dir(args)
    try:
        plan = plan_recovery(data_dir)
    except StoreError as err:
        raise CliError(str(err)) from None
    print(plan.describe())
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError("not recovering without a yes: run it in a terminal, or add --yes")
        if input("Recover? [y/N] ").strip().lower() not in ("y", "yes"):
            print("Nothing was changed.")
            return 1
    try:
        kept = recover(plan)
    except StoreError as err:
        raise CliError(str(err)) from None
    print(f"Recovered: the database is commit {plan.good_seq} again." +
          (f" The damaged file is kept as {kept}." if kept else ""))
    return 0


def _files(files) -> list[str]:
    width = max(len(f.path) for f in files)
    return [f"  {f.path:<{width}}  {f.size:>12,} bytes  sha256 {f.sha256}" for f in files]


def _backup(args: argparse.Namespace) -> int:
    from labq.store import StoreError
    from labq.store.backup import MANIFEST, backup

    data_dir = _existing_data_dir(args)
    try:
        manifest = backup(data_dir, args.dest)
    except StoreError as err:
        raise CliError(str(err)) from None
    restore = f"labq store restore {args.dest} --data-dir DATA_DIR"
    if args.json:
        print(json.dumps({"backup": str(args.dest), "data_dir": str(data_dir), "manifest": manifest.as_dict(),
                          "restore": restore}, indent=2))
        return 0
    print(f"Backed up {data_dir} into {args.dest}: commit {manifest.seq}, {manifest.unfinished_jobs} unfinished "
          f"job(s), {manifest.archive_records} archive record(s), next job id {manifest.next_job_id}.")
    print("\n".join(_files(manifest.files)))
    print(f"  {MANIFEST}  (what the backup holds, with these sizes and checksums)")
    print(f"Checked: every file reads back as written, and the database and the archive agree.\n"
          f"To restore it (with the leader stopped): {restore}")
    return 0


def _restore(args: argparse.Namespace) -> int:
    from labq.store import StoreError
    from labq.store.backup import restore

    data_dir = _data_dir(args)
    try:
        done = restore(args.source, data_dir, force=args.force)
    except StoreError as err:
        raise CliError(str(err)) from None
    m = done.manifest
    if args.json:
        print(json.dumps({"backup": str(args.source), "data_dir": str(data_dir), "manifest": m.as_dict(),
                          "next_job_id": done.next_job_id,
                          "replaced": str(done.replaced) if done.replaced else None}, indent=2))
        return 0
    print(f"Restored {args.source} into {data_dir}: commit {m.seq} of {m.source}, backed up {m.created} by labq "
          f"{m.labq_version}; {m.unfinished_jobs} unfinished job(s), {m.archive_records} archive record(s).")
    print("\n".join(_files(m.files)))
    print(f"Job ids continue from {done.next_job_id}, past those the backed-up leader had reserved, so jobs "
          f"submitted after the backup keep ids of their own.")
    if done.replaced:
        print(f"The files it replaced are kept in {done.replaced}.")
    print(f"Start the leader on it: labq leader --data-dir {data_dir}")
    return 0
