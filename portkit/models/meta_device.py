"""Real-size models without their weights: a Hugging Face architecture built from its published
config on the meta device, so the XLA compile-only check runs on it with no weight in memory.

The configs are data (data/models/configs.json, each with the model card it was copied from). A
meta model has shapes and dtypes only: stages that need values (fallbacks, accuracy) cannot run it.

    >>> from portkit.models import meta_device
    >>> from portkit.tpu_compile import compiler
    >>> m = meta_device.build("llama3-8b")                # 8.0e9 parameters, 0 bytes of weights
    >>> compiler.compile_for_tpu(m, [meta_device.text_shape(m, batch=1, seq=512)], "v5e:2x2")
"""
from __future__ import annotations

import json

import torch
from torch import nn

from portkit.core.errors import BadParameter
from portkit.core.locations import DATA
from portkit.models import huggingface

CONFIGS = DATA / "models" / "configs.json"


def _table() -> dict:
    return {k: v for k, v in json.loads(CONFIGS.read_text()).items() if not k.startswith("_")}


def names() -> list[str]:
    """The abstract model names portkit knows (data/models/configs.json)."""
    return sorted(_table())


def is_name(spec) -> bool:
    """True when `spec` names an abstract model: a name of data/models/configs.json, or a model spec as the
    plan step returns it (an absolute directory, a Hub id pinned to a commit) whose folder holds a config and
    no weights, of a text task (portkit.models.huggingface.config_only): a real-size model without weights."""
    return isinstance(spec, str) and (spec in _table() or huggingface.config_only(spec) is not None)


def source(name: str) -> str:
    """Where the config of `name` was copied from."""
    found = huggingface.config_only(name)
    return found[2] if found else _entry(name)["source"]


def _entry(name: str) -> dict:
    table = _table()
    if name not in table:
        raise BadParameter("abstract model", name, sorted(table))
    return table[name]


def build(name: str) -> nn.Module:
    """The architecture of `name` from its published config, on the meta device (no weights), in the
    config's dtype; its `portkit_abstract` attribute names it and its source."""
    import transformers

    if (found := huggingface.config_only(name)) is not None:
        return _from_config(*found)
    entry = _entry(name)
    values = dict(entry["config"])
    dtype = getattr(torch, values.pop("torch_dtype", "float32"))
    cls = getattr(transformers, entry["architecture"])
    config = cls.config_class(**values, use_cache=False)    # a forward pass, no KV cache returned
    with torch.device("meta"):
        module = cls(config).to(dtype).eval()
    module.portkit_abstract = {"name": name, "source": entry["source"]}
    return module


def _from_config(path, name: str, source: str) -> nn.Module:
    """A directory's config.json (its first architecture, in the config's dtype) on the meta device."""
    import transformers
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    config.use_cache = False    # a forward pass, no KV cache returned
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    cls = getattr(transformers, config.architectures[0])
    with torch.device("meta"):
        module = cls(config).to(dtype).eval()
    module.portkit_abstract = {"name": name, "source": source,
                               "kind": "causal-lm" if huggingface.task_of(config.to_dict()) == "causal-lm"
                               else "embedding"}
    return module


def text_shape(module: nn.Module, batch: int, seq: int) -> dict:
    """The input shape dict xla_compile takes for a causal LM: token ids of (batch, seq)."""
    limit = module.config.max_position_embeddings
    for key, value in (("batch", batch), ("seq", seq)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise BadParameter(key, value, hint=f"{key} must be a positive integer")
    if seq > limit:
        raise BadParameter("seq", seq, hint=f"{module.portkit_abstract['name']} takes at most {limit} tokens")
    return {"input_ids": ((batch, seq), "int64")}


def describe(module: nn.Module) -> dict:
    """The stage results' "model" entry for an abstract model (as LoadedModel.describe for a loaded one)."""
    info = module.portkit_abstract
    dtype = next(p.dtype for p in module.parameters())
    return {"name": info["name"], "kind": info.get("kind", "causal-lm"),
            "origin": f"published config, no weights: {info['source']}",
            "parameters": sum(p.numel() for p in module.parameters()), "inputs": ["input_ids"],
            "dtype": str(dtype).replace("torch.", ""), "abstract": True,
            "max_length": module.config.max_position_embeddings}


def summary(module: nn.Module) -> str:
    """One line for a notebook, as LoadedModel.summary."""
    d = describe(module)
    return f"{d['name']}: {d['kind']}, {size(d['parameters'])} parameters in {d['dtype']}, {d['origin']}"


def size(parameters: int) -> str:
    """A parameter count for people: '8.03 B', '1.3 M'."""
    return f"{parameters / 1e9:.2f} B" if parameters >= 1e9 else f"{parameters / 1e6:.2f} M"


# ---------------------------------------------------------------- for the XLA compile (portkit/tpu_compile/compiler.py)
def is_abstract(module: nn.Module) -> bool:
    """True for an nn.Module whose weights are on the meta device: shapes and dtypes, no values (False for
    anything else, a LoadedModel included)."""
    return isinstance(module, nn.Module) and any(t.is_meta for t in [*module.parameters(), *module.buffers()])


def extract_abstract(jax, torchax, module: nn.Module):
    """torchax.extract_jax for a module on the meta device: its states as jax.ShapeDtypeStructs, so
    the program is traced, lowered and compiled with no weight in memory (compile-only needs none)."""
    jit_module = torchax.JittableModule(module)
    dtype = torchax.ops.mappings.t2j_dtype
    states = {k: jax.ShapeDtypeStruct(tuple(t.shape), dtype(t.dtype))
              for k, t in {**jit_module.buffers, **jit_module.params}.items()}
    env = torchax.default_env()

    def jax_func(states, args, kwargs=None):   # as torchax.extract_jax's own
        params = {k: states[k] for k in jit_module.params}
        buffers = {k: states[k] for k in jit_module.buffers}
        params, buffers, args, kwargs = env.j2t_iso((params, buffers, args, kwargs or {}))
        with env:
            result = jit_module.functional_call("forward", params, buffers, *args, **kwargs)
        # a Hugging Face ModelOutput is not a JAX type: its tensors, in order
        return env.t2j_iso(result.to_tuple() if hasattr(result, "to_tuple") else result)
    return states, jax_func
