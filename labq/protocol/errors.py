"""The one error type of the API: an HTTP status, a stable code, and a sentence for people."""

from __future__ import annotations

API_VERSION = "v1"


class ApiError(Exception):
    """An HTTP status, a stable code, a sentence, and the field at fault (a plain class: the CLI
    imports this on every start, and dataclasses costs more to import than all of it)."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ApiError) and (self.status, self.code, self.message, self.field) == (
            other.status, other.code, other.message, other.field)

    __hash__ = Exception.__hash__

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.code!r}, {self.message!r}, {self.field!r})"

    def __str__(self) -> str:
        return self.message

    def to_json(self) -> dict:
        body = {"error": {"code": self.code, "message": self.message}}
        if self.field:
            body["error"]["field"] = self.field
        return body

    @classmethod
    def from_json(cls, status: int, body: object) -> ApiError:
        try:
            err = body["error"]  # type: ignore[index]
            return cls(status, str(err["code"]), str(err["message"]), err.get("field"))
        except (TypeError, KeyError):
            return cls(status, "bad_response", f"the leader answered {status} without a labq error body")


def bad_request(message: str, field: str | None = None) -> ApiError:
    return ApiError(400, "bad_request", message, field)


def unauthorized(message: str = "missing or unknown token; see `labq admin user add`") -> ApiError:
    return ApiError(401, "unauthorized", message)


def forbidden(message: str) -> ApiError:
    return ApiError(403, "forbidden", message)


def not_found(message: str) -> ApiError:
    return ApiError(404, "not_found", message)


def conflict(message: str) -> ApiError:
    return ApiError(409, "conflict", message)


def too_large(message: str) -> ApiError:
    return ApiError(413, "too_large", message)


def unprocessable(message: str, field: str | None = None) -> ApiError:
    return ApiError(422, "unprocessable", message, field)


def unavailable(message: str) -> ApiError:
    return ApiError(503, "unavailable", message)
