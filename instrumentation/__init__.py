"""flowtrial instrumentation: the latency-shaping proxy, its tokenizer and the simulated model."""
