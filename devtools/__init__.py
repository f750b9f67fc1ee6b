"""Development tools: benchmarks (`deepres bench ...`), the local control plane (`make cluster`) and local
pods and servers for tests. Never imported by `deepres serve` and not copied into the serving image."""
