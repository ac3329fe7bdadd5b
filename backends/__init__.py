"""Built-in state backends: heap (Python dicts) and RocksDB."""
