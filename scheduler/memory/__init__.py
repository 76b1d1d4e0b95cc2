"""KV memory: the request-to-token pool, the token allocator, the radix cache and the chunk cache (radix off)."""
