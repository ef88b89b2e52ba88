"""Real XLA compiles for TPU topologies on a CPU host (compile-only), their results, the verdict cache,
and compiles with the weights sharded over several chips."""
