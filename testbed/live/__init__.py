"""A live server as the third clock: `testbed replay --mode server --url URL` sends a trace to any
OpenAI-compatible server (vLLM, SGLang, `testbed serve`) and records what the client sees, into
the same run folder as the simulator and the real engine write."""
