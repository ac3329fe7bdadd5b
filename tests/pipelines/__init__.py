"""Pipelines that tests run in a subprocess (``sys.executable path/to/script.py ...``)."""
