"""pjrt_py benchmarks. Each module runs on its own: ``python -m benchmarks.dispatch``."""
