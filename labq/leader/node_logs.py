"""The leader's reading of a job's log from the node that ran it, for ``labq logs``."""

from __future__ import annotations

import http.client
import urllib.parse

from labq.protocol import errors


def fetch_log(url: str, token: str | None, job_id: int, attempt: int, offset: int) -> tuple[bytes, int, bool]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("GET", f"{parts.path.rstrip('/')}/v1/logs/{job_id}/{attempt}?offset={offset}",
                     headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        data = response.read()
        if response.status == 404:
            raise errors.not_found(f"the node has no log for job {job_id} attempt {attempt}")
        if response.status != 200:
            raise errors.unavailable(f"the node answered {response.status} for the log")
        return data, int(response.getheader("X-Labq-Offset", offset + len(data))), \
            response.getheader("X-Labq-Done") == "1"
    except ValueError:
        raise errors.unavailable("the node answered the log with a bad X-Labq-Offset") from None
    except OSError as err:
        raise errors.unavailable(f"cannot reach the node for the log: {err}") from None
    finally:
        conn.close()
