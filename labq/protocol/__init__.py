"""The wire format of labq: every API payload, its validation and its errors. Pure."""

from labq.protocol.errors import API_VERSION, ApiError

__all__ = ["API_VERSION", "ApiError"]
