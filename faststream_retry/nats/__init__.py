"""The NATS JetStream transport (issue 39): design f of docs/explanation/nats-design.md.

A failed message's copy waits in one *delay stream*, a subject per tier of the core's
ladder (``core.tiers``); a *re-check consumer* per tier waits until its head has spent
its tier's time there (JetStream's own timestamp), then, as ``core.decision.recheck_step``
says, sends it round the next tier or releases it to the failing subscriber's *ready
subject* in the same stream, where a consumer of the plugin's hands it to that
subscriber's FastStream pipeline. Dead letters go to a stream per covered stream. Every
publish carries ``Nats-Msg-Id`` and is confirmed by its PubAck before the message it came
from is acked.

One file per job: ``naming`` (names, subjects, message ids), ``wire`` (the ``retry-*``
headers as NATS carries them), ``publisher`` (PubAck), ``streams`` (the delay stream),
``dead_letters`` (the dead-letter streams), ``recheck`` (a tier's re-check consumer),
``ready`` (the hand-over), ``fetch`` (one pull of their loops), ``checks`` (what a
covered subscriber must be), ``sink`` (a handler's failure carried out), ``live`` (the
running parts). Nothing here imports FastStream or aio-pika; the FastStream side is
``middleware.nats.runtime``.
"""
