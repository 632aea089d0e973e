"""The suites, one module each (benchmarks/registry.py lists them in page order)."""
