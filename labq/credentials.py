"""The credentials file, ``~/.config/labq/credentials``: where a user's leader is and the token that says who they are.

``labq login``, ``labq up`` and ``labq admin user add`` save it (``save_credentials``, 0600, atomically, as its
owner); every command reads it (``load_credentials``) to make its ``labq.client.Client``. It is plain TOML
(``labq.plain_toml``), so a command's start reads it without ``tomllib``.
"""

from __future__ import annotations

import os

from labq.plain_toml import plain_toml, toml_string
from labq.protocol.errors import ApiError

TYPE_CHECKING = False  # typing's, without importing typing: 3 ms of the CLI's start (type checkers take it as true)
if TYPE_CHECKING:
    from pathlib import Path


def normalize_url(url: str) -> str:
    """``host:7733`` -> ``http://host:7733``; no trailing slash. People type addresses both ways: the file keeps
    a leader's address so, and ``labq.client.Client`` takes it so."""
    url = url.strip()
    return (url if "://" in url else "http://" + url).rstrip("/")


def credentials_path(home: str | Path | None = None) -> Path:
    """Our file: ``$XDG_CONFIG_HOME/labq/credentials`` or ``~/.config/...``; with ``home``, that user's."""
    from pathlib import Path

    if home is not None:
        return Path(home) / ".config" / "labq" / "credentials"
    return Path(_credentials_file())


def _credentials_file() -> str:
    """``credentials_path()`` as a string, for a command that only reads the file: pathlib costs 2 ms of a start."""
    home = os.path.expanduser("~")
    if home.startswith("~"):
        raise RuntimeError("Could not determine home directory.")  # as Path.home() says it
    return os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"), "labq", "credentials")


def load_credentials(path: Path | None = None) -> dict:
    """``{"leader", "token", "pin"}`` from the TOML file; ``{}`` when there is none."""
    path = path or _credentials_file()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return {}
    except OSError as err:
        raise ApiError(0, "bad_credentials", f"cannot read {path}: {err}") from None
    doc = plain_toml(data)
    if doc is None:
        import tomllib

        try:
            doc = tomllib.loads(data.decode())
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
            raise ApiError(0, "bad_credentials", f"cannot read {path}: {err}") from None
    return {k: v for k, v in doc.items() if k in ("leader", "token", "pin") and isinstance(v, str)}


def credentials_text(leader: str, token: str, pin: str | None = None) -> str:
    """The lines a user puts in their credentials file: the leader, the token, and for TLS the lab's CA pin."""
    text = f"leader = {toml_string(normalize_url(leader))}\ntoken = {toml_string(token)}\n"
    return text + (f"pin = {toml_string(pin)}\n" if pin else "")


def save_credentials(leader: str, token: str, path: Path | None = None,
                     owner_uid: int | None = None, owner_gid: int | None = None, pin: str | None = None) -> Path:
    """Writes the file atomically, 0600 in a 0700 folder.

    For another user (root saving ``labq admin user add bob`` into bob's home), a child
    process writes as that user: the file and folders are theirs, and a symlink they
    planted cannot make root write anywhere they could not write themselves.
    """
    import tempfile  # noqa: F401 - before a fork, not in the child

    from pathlib import Path

    path = Path(path or credentials_path())
    text = credentials_text(leader, token, pin)
    if owner_uid is None or owner_uid == os.geteuid():
        _write_private(path, text)
        return path
    if owner_gid is None:
        import pwd

        owner_gid = pwd.getpwuid(owner_uid).pw_gid
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become the user, write, report
        os.close(read_end)
        code = 0
        try:
            os.setgroups([])
            os.setgid(owner_gid)
            os.setuid(owner_uid)
            _write_private(path, text)
        except BaseException as err:  # noqa: BLE001 - everything goes back to the parent as text
            os.write(write_end, str(err).encode()[:2000])
            code = 1
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as report:
        message = report.read().decode(errors="replace")
    if os.waitpid(pid, 0)[1] != 0:
        raise ApiError(0, "bad_credentials", f"could not write {path} as uid {owner_uid}: {message or 'failed'}")
    return path


def _write_private(path: Path, text: str) -> None:
    import tempfile

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".credentials.")  # created 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
