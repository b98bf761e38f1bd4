"""The dead-letter page (the ``web`` extra): ``create_app`` returns it as an ASGI app.

Serve it with ``faststream-retry web``, or mount it in your own Starlette or FastAPI
service (``app.mount("/dead-letters", create_app(...))``). See docs/how-to/web.md.
"""

from faststream_retry.web.app import create_app

__all__ = ["create_app"]
