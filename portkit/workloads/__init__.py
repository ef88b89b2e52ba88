"""The workloads teams migrate besides one forward pass: greedy generation with a KV cache (causal LMs and
encoder-decoders), training steps, and a stateful streaming step."""
