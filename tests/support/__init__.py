"""Stand-ins used by tests and benchmarks only (not shipped): `stub_server` (a model-free /generate
stub for the SGLang client's concurrency), `routing_probe` (rollout routing replay measurements) and
`onpolicy` (engine-vs-trainer log-prob agreement)."""
