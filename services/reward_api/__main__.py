"""``python -m services.reward_api --host 127.0.0.1 --port 8000 --workers N``: uvicorn around the app.

The worker count: ``--workers``, else ``REWARD_API_WORKERS``, else 1.

With ``--workers`` > 1 and no ``PROMETHEUS_MULTIPROC_DIR``, a fresh temporary folder is used for it, so
``/metrics`` on any worker reports all workers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

import uvicorn


def _env_workers(parser: argparse.ArgumentParser) -> int:
    """``REWARD_API_WORKERS`` (the compose files' and launchers' knob), else 1; ``--workers`` wins."""
    value = os.environ.get("REWARD_API_WORKERS", "").strip()
    if not value:
        return 1
    try:
        return int(value)
    except ValueError:
        parser.error(f"REWARD_API_WORKERS must be an integer, got {value!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.reward_api", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="Address to bind (default 127.0.0.1).")
    parser.add_argument("--port", type=int, default=8000, help="Port (default 8000).")
    parser.add_argument(
        "--workers",
        type=int,
        default=_env_workers(parser),
        help="Worker processes (default $REWARD_API_WORKERS, else 1).",
    )
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    made_dir = None
    if args.workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        made_dir = tempfile.mkdtemp(prefix="reward-api-prom-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = made_dir  # inherited by the spawned workers
    try:
        uvicorn.run(
            "services.reward_api.app:app",
            host=args.host,
            port=args.port,
            workers=args.workers,
            log_config=None,  # the app logs JSON lines itself
            access_log=False,
            timeout_graceful_shutdown=10,
        )
    finally:
        if made_dir:
            shutil.rmtree(made_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
