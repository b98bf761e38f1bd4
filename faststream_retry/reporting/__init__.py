"""What is told of each retry: the reporter, and the logs, spans and metrics it drives.

Imports the core and OpenTelemetry's API, nothing of a broker.
"""
