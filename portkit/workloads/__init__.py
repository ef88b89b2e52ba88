"""The workloads teams migrate besides one forward pass: greedy generation with a KV cache, training
steps, and a stateful streaming step."""
