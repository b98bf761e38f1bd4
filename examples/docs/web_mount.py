"""The dead-letter page inside a FastAPI service, under /dead-letters."""

import os

from fastapi import FastAPI

from faststream_retry.web import create_app

api = FastAPI()
api.mount(
    "/dead-letters",
    create_app(
        os.environ.get("RABBITMQ_URL", "amqp://guest:guest@localhost:5672/"),
        # Everyone shows it: /dead-letters/login?token=... Without one, the page
        # serves no one: it cannot tell a proxy in front of the service from a
        # client on this machine.
        token=os.environ.get("DEAD_LETTERS_TOKEN"),
        allow_actions=os.environ.get("DEAD_LETTERS_ACTIONS") == "1",
    ),
)
