"""Nexmark: the queries in the per-record API, their batch reference (pandas), and the
benchmark (``python -m bench.nexmark``)."""
