"""What the compiled graph holds, and whose code a finding is: an op that is not an ATen op is a finding with its
owner and what portkit checked inside it; data dependence is what PyTorch's fake kernels say, not a list of names;
a finding located in portkit's own wrapper is portkit's, never the user's."""
import sys
import textwrap

import pytest
import torch
from torch import nn

from portkit.core import owners
from portkit.stages import reconcile
from portkit.core.torch_private import output_size_follows_values
from portkit.corpora.requests import Requests
from portkit.models import registry
from portkit.stages.compile import stage
from portkit.stages.fallbacks import recording
from portkit.stages.fallbacks.stage import find_fallbacks
from portkit.targets import foreign_ops


# ---------------------------------------------------------------- an op that is not ATen's
@torch.library.custom_op("portkit_test_user::scaled", mutates_args=())
def scaled(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The user's own custom op: ATen ops of static sizes inside, nothing to report but that it is opaque."""
    return x * scale


@scaled.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _keep_scale(ctx, inputs, output):
    ctx.scale = inputs[1]


scaled.register_autograd(lambda ctx, grad: (grad * ctx.scale, None), setup_context=_keep_scale)


GROUPED_LIBRARY = '''
    """A library that registers a grouped-matmul fallback as a torch.library custom op."""
    import torch


    @torch.library.custom_op("portkit_test_lib::grouped_mm", mutates_args=())
    def grouped_mm(x: torch.Tensor, w: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        outs, start = [], 0
        for n in sizes.tolist():                      # the host read
            outs.append(x[start:start + n] @ w)       # the data-sized matmul
            start += n
        return torch.cat(outs)


    @grouped_mm.register_fake
    def _(x, w, sizes):
        return x.new_empty(x.shape[0], w.shape[1])
'''


@pytest.fixture(scope="module")
def grouped_library(tmp_path_factory):
    """The library, installed where libraries are (a site-packages folder), imported once."""
    root = tmp_path_factory.mktemp("env") / "site-packages"
    (root / "portkit_testlib").mkdir(parents=True)
    (root / "portkit_testlib" / "__init__.py").write_text(textwrap.dedent(GROUPED_LIBRARY))
    sys.path.insert(0, str(root))
    try:
        import portkit_testlib
    finally:
        sys.path.remove(str(root))
    return portkit_testlib


class GroupedExperts(nn.Module):
    """A mixture-of-experts layer in small: tokens split into two groups by their ids, the library's grouped matmul
    over the groups, then the user's own custom op."""

    def __init__(self, grouped_mm):
        super().__init__()
        self.grouped_mm = grouped_mm
        self.embed = nn.Embedding(30522, 8)
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, input_ids, attention_mask):
        h = self.embed(input_ids).flatten(0, 1)
        odd = (input_ids.flatten() % 2).sum().reshape(1)
        sizes = torch.cat([odd, input_ids.numel() - odd])
        out = self.grouped_mm(h, self.w, sizes)   # the library's op
        return {"out": scaled(out, attention_mask.sum().to(out.dtype))}   # the user's op


def compiled_findings(module: nn.Module, targets=("neuron", "tpu")) -> stage.CompileReport:
    m = registry.LoadedModel(type(module).__name__, registry.TOKEN_CLASSIFIER, registry.OutputsAdapter(module).eval(),
                           "test module", tokenizer=registry.minilm_tokenizer())
    text = "Experts split the tokens into groups."
    requests = Requests([[text]], [m.encode([text], pad_to=8)], "test", m)
    cost = stage.economics.neuron_estimate(10**6)    # not about the price of a compile
    return stage.compile_model(m, requests, list(targets), stage.Options.of({"seq_len": 8}),
                                   storm=stage.StormSettings(progress=False), costs=dict.fromkeys(targets, cost))


@pytest.fixture(scope="module")
def experts(grouped_library):
    return compiled_findings(GroupedExperts(grouped_library.grouped_mm))


def test_every_non_aten_op_in_a_compiled_graph_is_a_finding_with_its_owner_and_what_was_checked(experts,
                                                                                                  grouped_library):
    """Rule: each op outside PyTorch's namespaces in a compiled graph is a finding on every target, naming the op,
    whose code it is (where it is defined: a library's site-packages file, the user's file), and what portkit
    checked inside it and could not; the library's grouped matmul reads values on the host (.tolist()) and runs
    matmuls whose sizes follow the data, each named at its line."""
    for target in ("neuron", "tpu"):
        found = {f["message"].split(" ")[0]: f for f in experts.findings(target) if f["kind"] == "foreign_op"}
        assert set(found) == {"portkit_test_lib::grouped_mm", "portkit_test_user::scaled"}
        lib, user = found["portkit_test_lib::grouped_mm"], found["portkit_test_user::scaled"]
        assert lib["owner"]["owner"] == owners.LIBRARY and lib["owner"]["package"] == "portkit_testlib"
        assert user["owner"]["owner"] == owners.USER and user["where"]["file"] == __file__
        assert "tolist()" in lib["message"] and "# the host read" in lib["message"]
        assert "aten::mm at" in lib["message"] and "# the data-sized matmul" in lib["message"]
        assert "Not checked: whether the target's compiler lowers it" in lib["message"]
        assert "not your code (portkit_testlib" in lib["advice"]   # a library's: upgrade, setting or wrapper
        # the user's op has nothing inside to report but that it is opaque: no host read, no data-sized op
        assert "inside it:" not in user["message"] and "Checked: a fake (meta) kernel" in user["message"]
        assert user["occurrences"]["calls_inside"] == {"aten::mul.Tensor": 1} and user["occurrences"]["traced"]
        assert lib["severity"] == user["severity"] == "work"
        # the same cause stage 1 gives the op at the same call: one cause, one finding
        assert lib["cause"].startswith("custom_op: portkit_test_lib::grouped_mm at ")
        assert lib["cause"].endswith(f"{__file__}:{line_of('# the library' + chr(39) + 's op')}")


class ScaledTagger(nn.Module):
    """The user's op in a model that trains: an embedding, a linear layer, the op."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(30522, 8)
        self.proj = nn.Linear(8, 8)

    def forward(self, input_ids, attention_mask):
        h = self.proj(self.embed(input_ids))
        return {"logits": scaled(h, attention_mask.sum().to(h.dtype))}


def test_a_non_aten_op_in_the_training_steps_graphs_is_one_finding_too(corpus):
    """Rule: the training step's compiled graphs are compiled graphs too: an op outside PyTorch's namespaces there
    is listed and becomes the stage's one finding for that op (not one per graph or workload)."""
    from portkit.stages.compile import training
    m = registry.LoadedModel("scaled", registry.TOKEN_CLASSIFIER, ScaledTagger(), "test module",
                           tokenizer=registry.minilm_tokenizer())
    m.loss = lambda module, batch: module(**batch)["logits"].square().mean()
    found = training.check(m, corpus, ["neuron"], steps=2, batch_size=2, seq_len=8)["neuron"]
    assert [op["op"] for op in found.foreign_ops] == ["portkit_test_user::scaled"] and found.refused is None
    inference = {"foreign_ops": found.foreign_ops}   # the same op in the inference graphs: still one finding
    for check in ({}, inference):
        [finding] = stage._foreign_ops(check, found, "neuron")
        assert finding["owner"]["owner"] == owners.USER and finding["kind"] == "foreign_op"
        assert finding["message"].startswith("portkit_test_user::scaled is not an ATen op (user code")


def line_of(marker: str) -> int:
    return next(i for i, line in enumerate(open(__file__).read().splitlines(), 1) if marker in line)


def test_an_op_without_a_python_function_says_it_was_not_looked_inside():
    """Rule: where the op was not made with torch.library.custom_op, portkit says it could not see inside it."""
    lib = torch.library.Library("portkit_test_opaque", "DEF")   # noqa: TOR901 - a kernel portkit cannot read
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
    func = torch.ops.portkit_test_opaque.twice.default
    assert foreign_ops.is_foreign(func) and not foreign_ops.is_foreign(torch.ops.aten.mm.default)
    found = foreign_ops.look_inside(func, (torch.ones(2),), {}, stage.specs.detect("tpu").op_table)
    assert not found["traced"] and found["defined"] is None
    assert found["not_checked"][0].startswith("what it runs inside: it was not made with torch.library.custom_op")


# ---------------------------------------------------------------- data dependence, as PyTorch says
@pytest.mark.parametrize("call,depends", [
    (lambda x, r: torch.histc(x, bins=5), False),                 # its size is bins, whatever the values
    (lambda x, r: torch.repeat_interleave(r, r, output_size=6), False),   # the size is given
    (lambda x, r: torch.nonzero(x > 0), True),
    (lambda x, r: torch.unique(x), True),
    (lambda x, r: torch.masked_select(x, x > 0), True),
    (lambda x, r: torch.repeat_interleave(r, r), True),            # repeats from a tensor's values
    (lambda x, r: x[x > 0], True),                                # boolean-mask indexing
], ids=["histc", "repeat_interleave output_size", "nonzero", "unique", "masked_select", "repeat_interleave",
        "mask index"])
def test_data_dependence_is_what_pytorchs_fake_kernel_says(call, depends):
    """Rule: an op is data-dependent where PyTorch's fake kernel raises for a size it cannot know or gives its output
    an unbacked size; histc (size: bins) and a repeat_interleave given its output size are not."""

    class Call(nn.Module):
        def forward(self, x, r):
            return call(x, r)

    found = recording.record(Call(), {"x": torch.randn(10), "r": torch.tensor([1, 2, 3])})
    assert any(kind == "data_dependent" for kind, *_ in found.features) == depends
    op = {False: torch.ops.aten.histc.default, True: torch.ops.aten.nonzero.default}[depends]
    assert output_size_follows_values(op, (torch.randn(4),), {"bins": 3} if not depends else {}) == depends


# ---------------------------------------------------------------- portkit's own code
def test_a_finding_in_portkits_own_adapter_is_portkits_not_the_users():
    """Rule: a finding located in portkit's model wrappers (portkit/models/adapters.py: here the built-in LSTM
    tagger's recurrent layer) is owned by portkit, with advice about a factory of the user's own, never "user"."""
    m = registry.load("lstm")
    found = find_fallbacks(m, m.encode(["Return x."], pad_to=6), ["neuron"])
    [f] = [f for f in found.targets["neuron"].findings if f.kind == "recurrent"]
    assert f.where["file"].endswith("portkit/models/adapters.py")
    assert f.owner["owner"] == owners.PORTKIT and f.owner["package"] == "portkit (portkit/models/adapters.py)"
    assert "factory of your own" in f.advice
    assert reconcile.reconcile([f.to_dict()], None, "neuron")[0]["owner"]["owner"] == owners.PORTKIT
    # the user's own file stays the user's; portkit's other files are portkit's too
    assert owners.owner({"file": __file__, "line": 1})["owner"] == owners.USER
    assert owners.owner({"file": stage.__file__, "line": 1})["owner"] == owners.PORTKIT


def _tiny_mixtral(experts: str) -> nn.Module:
    """transformers' Mixtral at a tiny size, random weights, its experts run by `experts` (experts_implementation)."""
    from transformers import MixtralConfig, MixtralForCausalLM
    from portkit.models.adapters import LogitsAdapter
    torch.manual_seed(0)
    config = MixtralConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2,
                           max_position_embeddings=64, experts_implementation=experts)
    return LogitsAdapter(MixtralForCausalLM(config).eval(), cache_flag=False)


def test_a_real_moes_grouped_matmul_fallback_is_a_finding_with_its_host_read_and_its_setting():
    """Rule (every non-ATen op in a compiled graph is a finding), on a real public architecture: transformers' Mixtral
    at a tiny size with experts_implementation='grouped_mm' compiles, in float32, to the library's own custom op
    transformers::grouped_mm_fallback, which reads the group offsets on the host (.tolist()). Its finding names the
    op, transformers as the owner with the setting that changes the path (experts_implementation), the host read at
    its line and what portkit could not check (the other direction, ATen-only graphs without the finding, is pinned
    on the built models above)."""
    report = compiled_findings(_tiny_mixtral("grouped_mm"), targets=("tpu",))
    [found] = [f for f in report.findings("tpu") if f["kind"] == "foreign_op"]
    assert found["message"].startswith("transformers::grouped_mm_fallback is not an ATen op (configurable library")
    assert found["owner"]["owner"] == owners.CONFIGURABLE and found["owner"]["setting"] == "experts_implementation"
    assert "reads tensor values on the host" in found["message"] and ".tolist()" in found["message"]
    assert "Not checked:" in found["message"] and "experts_implementation" in found["advice"]
    assert found["severity"] == "work"
