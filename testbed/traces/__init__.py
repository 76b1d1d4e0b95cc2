"""Request traces: the native schema, the public formats it imports (Mooncake, Azure, ShareGPT),
the generator, and the `testbed trace` command."""
