"""What both runtimes run, the middleware's and the standalone worker's, on aio-pika.

``live`` holds a started runtime's channels, publisher and re-check consumers, ``recheck``
re-checks a copy a delay tier hands back, and ``step`` publishes one decided copy. No
module here imports FastStream.
"""
