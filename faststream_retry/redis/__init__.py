"""The Redis Streams side, on redis-py's asyncio client: keys, scripts, steps, mover, claimer.

No module here imports FastStream or an AMQP library. ``keys`` names every key of a
covered stream in its hash slot, ``envelope`` reads and writes FastStream's encoded
message, ``lua`` holds the three atomic scripts, ``steps`` runs the two a failure takes,
``mover`` moves due copies back, ``claimer`` brings back dead consumers' entries and
keeps this replica's alive, ``tasks`` stops their tasks, ``client`` names the clients
taken, ``checks`` reads what the server must offer, and ``engine`` puts them together
for the middleware (its docstring is the interface).
"""
