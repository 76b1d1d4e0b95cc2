"""SGLang's scheduler: waiting queue, policies, PrefillAdder budgets, chunked prefill, retraction, and its decode stretches."""
