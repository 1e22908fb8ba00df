"""Generated sample data (no third-party media) for the demos, tests and benchmarks."""
