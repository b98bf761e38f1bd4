"""A broker's URL as errors may show it, and why a connection failed, in words."""

from __future__ import annotations

__all__ = ["connect_failure", "safe_url"]


def connect_failure(url: str, exc: BaseException) -> str:
    """Say, in one line without the password, why connecting to ``url`` failed."""
    return f"cannot connect to {safe_url(url)}: {_why(exc)}"


def _why(exc: BaseException) -> str:
    """Say why a connection failed, in words: the broker's reason for closing it, if any."""
    text = str(exc) or type(exc).__name__
    if "Connection.Close" in text or "Connection.OpenOk" in text:
        return (
            "the broker closed the connection while opening it: check the user, the "
            "password and the vhost (the URL's path: / is %2F) and its permissions"
        )
    return text


def safe_url(url: str) -> str:
    """Return ``url`` without its password, for error texts."""
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not sep or not at:
        return url
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"
