"""Development tools: real servers for tests and benchmarks."""
