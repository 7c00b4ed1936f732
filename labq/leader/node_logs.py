"""The leader's reading of a job's log from the node that ran it, for ``labq logs``."""

from __future__ import annotations

from labq.protocol import errors
from labq.transport import Request, Transport, socket_transport

FETCH_TIMEOUT_S = 10.0


def fetch_log(url: str, token: str | None, job_id: int, attempt: int, offset: int,
              transport: Transport = socket_transport, tls=None) -> tuple[bytes, int, bool]:
    """Bytes from ``offset`` of an attempt's log on the agent at ``url``, the next offset, and whether it ended;
    ``tls`` is the context of an ``https://`` node (``Agents.logs_tls``: the lab's CA, that node's name)."""
    request = Request("GET", f"{url.rstrip('/')}/v1/logs/{job_id}/{attempt}?offset={offset}",
                      {"Authorization": f"Bearer {token}"}, timeout=FETCH_TIMEOUT_S, tls=tls)
    try:
        response = transport(request)
        try:
            data = response.read()
        finally:
            response.close()
        if response.status == 404:
            raise errors.not_found(f"the node has no log for job {job_id} attempt {attempt}")
        if response.status != 200:
            raise errors.unavailable(f"the node answered {response.status} for the log")
        return data, int(response.header("X-Labq-Offset", offset + len(data))), \
            response.header("X-Labq-Done") == "1"
    except ValueError:
        raise errors.unavailable("the node answered the log with a bad X-Labq-Offset") from None
    except OSError as err:
        raise errors.unavailable(f"cannot reach the node for the log: {err}") from None
