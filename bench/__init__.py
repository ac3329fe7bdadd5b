"""Benchmarks (not tests): throughput, checkpoint cost and recovery against baselines."""
