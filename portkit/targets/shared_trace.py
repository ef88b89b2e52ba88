"""Several targets' compile backends in one Dynamo pass, the graph run chosen by whose turn it is.

A static-shape target compiles one graph per input shape, so the emulated targets compile the same graphs:
tracing a shape once for all of them, not once a target, saves one Dynamo trace per shape for every
target after the first. Stage 2's fixed shape (fixed_shape.check_fixed_shapes) and stage 4's
compiled runs (target_runs.SharedCompile) use it; stage 2's storm shares its pass the same way but runs
Dynamo's graph as captured (storm.recompile_storms).
"""
from __future__ import annotations

from portkit.core.errors import CompileRefused


class Turns:
    """One Dynamo pass for several targets' backends (static-shape targets compile the same graphs, one per
    shape): each graph Dynamo captures goes to every target's backend, and the compiled code runs the graph
    of the target whose `turn` it is. A target whose backend refuses a graph raises its refusal in its own
    turn; the others go on. Stage 2's fixed shape and stage 4's compiled runs trace a shape once this way.

        >>> turns = Turns({"neuron": backends.CompileCounter(backends.portkit_neuron),
        ...                "tpu": backends.CompileCounter(backends.portkit_tpu)})
        >>> fn = torch.compile(module, backend=turns, dynamic=False)
        >>> turns.turn = "tpu"; fn(**inputs)      # compiles for both, runs the TPU's graph
    """

    def __init__(self, backends: dict):
        self.backends, self.turn = backends, None
        self.__name__ = "+".join(getattr(b, "__name__", type(b).__name__) for b in backends.values())

    def __call__(self, gm, example_inputs, **kwargs):
        compiled = {}
        for name, backend in self.backends.items():
            try:
                compiled[name] = backend(gm, example_inputs)
            except CompileRefused as exc:
                compiled[name] = exc

        def run(*args):
            graph = compiled[self.turn]
            if isinstance(graph, CompileRefused):
                raise graph
            return graph(*args)
        return run
