"""Imported last by the stage kernels' fork server (kernel_forks.PRELOAD): what the server's imports made is moved out
of the cyclic garbage collector's reach (gc.freeze) right before the server forks its first kernel.

Python's gc docs (gc.freeze): a process that forks without exec should call gc.freeze() right before fork(), so that
the children's collections do not write to the objects they inherited. Unfrozen, a forked kernel's first full
collection writes to every inherited object (about 90 MiB of the server's pages copied into each kernel) and each of
its full collections scans them again (about 0.2 s each): benchmarks/bench_kernel_start.py measures both. Frozen,
they are neither: they stay alive as before and reference counting still frees them; only a reference cycle among
them would never be collected, and the collection just before the freeze leaves none. A launched kernel (a new
interpreter) never imports this module.
"""
import gc

gc.collect()
gc.freeze()
