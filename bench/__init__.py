"""Benchmarks of the reward service against what users would otherwise write (docs/benchmarks.md).

``python -m bench all`` reruns every benchmark; each writes JSON + a Markdown summary (and a PNG where
a plot reads better) to ``bench/results/`` with the machine, versions, command and timestamp.
"""
