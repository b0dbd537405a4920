"""``python -m services.reward_api --host 127.0.0.1 --port 8000 --workers N``: uvicorn around the app.

The worker count: ``--workers``, else ``REWARD_API_WORKERS``, else 1.

With ``--workers`` > 1 and no ``PROMETHEUS_MULTIPROC_DIR``, a fresh temporary folder is used for it, so
``/metrics`` on any worker reports all workers.

Fail closed: without ``REWARD_API_TOKEN`` the service refuses to bind a non-loopback address (anyone who
can reach it could spend executor time) unless ``--insecure`` or ``REWARD_API_INSECURE=true`` says so.
uvicorn gets the connection cap (``MAX_CONNECTIONS``, its ``limit_concurrency``: more → 503), the header
deadline (``protocol``) and a graceful shutdown as long as a request may run (``SHUTDOWN_GRACE_S``).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import shutil
import tempfile

import uvicorn

from services.reward_api.settings import Settings, get_settings
from shared.wire import REWARD_API_PORT

log = logging.getLogger("reward_api")


def is_loopback(host: str) -> bool:
    """``127.0.0.0/8``, ``::1`` or ``localhost``; anything else (``0.0.0.0``, a name, a LAN address) is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refuse_open_bind(host: str, settings: Settings, insecure: bool) -> str | None:
    """Why this bind must be refused (a non-loopback address without a token), or ``None``."""
    if settings.token is not None or is_loopback(host) or insecure or settings.insecure:
        return None
    return (
        f"refusing to serve on {host} without REWARD_API_TOKEN: anyone who can reach it could spend executor "
        "time. Set REWARD_API_TOKEN, bind 127.0.0.1, or pass --insecure (REWARD_API_INSECURE=true) deliberately."
    )


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
    parser.add_argument(
        "--port", type=int, default=REWARD_API_PORT, help=f"Port (default {REWARD_API_PORT}: shared.wire)."
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=_env_workers(parser),
        help="Worker processes (default $REWARD_API_WORKERS, else 1).",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="Serve a non-loopback address without REWARD_API_TOKEN (refused otherwise).",
    )
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    settings = get_settings()
    refusal = refuse_open_bind(args.host, settings, args.insecure)
    if refusal:
        parser.error(refusal)
    if settings.token is None and not is_loopback(args.host):
        log.warning("serving %s WITHOUT a token (--insecure): /reward/* is open to anyone who reaches it", args.host)
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
            http="services.reward_api.protocol:HttpProtocol",
            limit_concurrency=settings.max_connections,
            timeout_graceful_shutdown=int(settings.shutdown_grace_s),
        )
    finally:
        if made_dir:
            shutil.rmtree(made_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
