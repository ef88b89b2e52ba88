"""The targets as data (specs), their numerics on the CPU, the emulated compile backends and the rule that
picks one, tolerances, capacity figures, and what a CPU recording cannot show of a device's path."""
