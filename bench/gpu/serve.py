"""Kept for bench/gpu/ab.sh only, until it goes: ``python -m trainer serve start|wait|stop``
(``trainer/serving/cli.py``) is the command, with the same options."""

import sys

from trainer.serving.cli import app

if __name__ == "__main__":
    app(sys.argv[1:], prog_name="python -m bench.gpu.serve")
