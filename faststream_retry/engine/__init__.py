"""What both runtimes run, the middleware's and the standalone worker's, on aio-pika.

``live`` holds a started runtime's channels, publisher and re-check consumers,
``recheck`` re-checks a copy a delay tier hands back, ``consumer`` is the skeleton of
the re-check and intake consumers (their consumers, deliveries in flight, settling,
stopping), ``step`` publishes one step's copy, ``requeues`` counts the requeues of copies
this process could not confirm, and ``outages`` holds outage mode's gates.
No module here imports FastStream.
"""
