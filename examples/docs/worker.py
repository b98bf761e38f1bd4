"""The retry worker, run from Python instead of ``faststream-retry worker``."""

from pathlib import Path

from opentelemetry.trace import TracerProvider

from faststream_retry import RetryWorker, load_worker_config


async def run_worker(
    url: str, config: Path, provider: TracerProvider | None = None
) -> None:
    """Run the worker of ``config`` (a retry.toml) on ``url`` until SIGTERM."""
    worker = RetryWorker(
        load_worker_config(config), url=url, tracer_provider=provider
    )
    await worker.run()  # until SIGTERM; or: async with worker: ...
