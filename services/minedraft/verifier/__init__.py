"""Target verifier service: target model, paged KV cache and the rejection sampler."""
