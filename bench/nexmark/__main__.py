"""``python -m bench.nexmark``: the Nexmark queries' throughput, latency and memory on one
core with exactly-once checkpoints every second (see :mod:`bench.nexmark.run`)."""

from .run import main

main()
