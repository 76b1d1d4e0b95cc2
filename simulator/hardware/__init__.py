"""Hardware: accelerator (or CPU) specs, bundled as JSON beside this file, a user's JSON file or an AIConfigurator system, and how many tokens of KV cache fit on one, as SGLang sizes its pool."""
