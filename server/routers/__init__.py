"""HTTP routes, one module per group: audio, models, probes."""
