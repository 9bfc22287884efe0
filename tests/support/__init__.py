"""Stand-ins used by tests and benchmarks only (not shipped): `stub_server` (a model-free /generate
stub for the SGLang client's concurrency) and `routing_probe` (rollout routing replay measurements)."""
