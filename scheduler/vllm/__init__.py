"""vLLM v1's scheduler: one token budget per step, block-granular prefix caching, preemption by recompute, and its decode stretches."""
