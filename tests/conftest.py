import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PORTKIT_HEADLESS", "1")   # notebook kernels started by nbval skip widgets


def _session_cache_root() -> str:
    """A fresh portkit cache root for this test session (portkit.corpora.corpus.cache_root).

    Set in os.environ at import, so the notebook kernels and subprocesses the tests start inherit it:
    no test reads or writes the user's XLA verdicts or lowerings, every session compiles for real once, and
    within a session no shape is compiled twice. The corpora's caches of the user's (corpus.CORPUS_CACHES: the
    standard library's docstrings, keyed by Python version and path; synthesized speech) are copied in: they do not
    depend on anything a test changes, and re-reading the standard library would cost seconds per session. Nothing
    else is (the zoo's model directories, gigabytes, are rebuilt by the tests that need them)."""
    from portkit.corpora.corpus import CACHE_VARIABLE, CORPUS_CACHES, cache_root
    user_root, root = cache_root(), tempfile.mkdtemp(prefix="portkit-test-cache-")
    for pattern in CORPUS_CACHES if user_root.is_dir() else ():
        for found in user_root.glob(pattern):
            (shutil.copytree if found.is_dir() else shutil.copy2)(found, Path(root) / found.name)
    os.environ[CACHE_VARIABLE] = root
    return root


SESSION_CACHE = _session_cache_root()

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "models.py"


def fixture_model(name: str) -> str:
    """A model spec for one of the fixture factories."""
    return f"{FIXTURES}:{name}"


@pytest.fixture(autouse=True)
def emulated_unless_native(request, monkeypatch):
    """Tests not marked `native` check the emulated path, which a host with a vendor device would
    otherwise replace by the native one (portkit.targets.specs.MODE_VARIABLE). Tests that read what the
    notebooks wrote follow whatever mode those ran in."""
    if not (request.node.get_closest_marker("native") or request.node.get_closest_marker("after_notebooks")):
        from portkit.targets import specs
        monkeypatch.setenv(specs.MODE_VARIABLE, "emulated")


@pytest.fixture(scope="session")
def corpus():
    from portkit.corpora.corpus import load_corpus
    return load_corpus("stdlib")


@pytest.fixture(scope="session")
def minilm():
    from portkit.models import registry
    return registry.load("minilm")


@pytest.fixture(scope="session")
def gpt2():
    """The seeded GPT-2 architecture (2 layers): a causal LM built from a Hugging Face config."""
    from portkit.models import registry
    return registry.load("gpt2")


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The whole workbook on the tiny encoder, both targets, as `portkit run` writes it: one run for every test
    that reads a complete run folder (the report's figures, the deployment exports and the CI gate)."""
    from portkit import cli
    out = tmp_path_factory.mktemp("tiny_run")
    args = ["run", "--model", fixture_model("tiny_encoder"), "--target", "neuron", "--target", "tpu",
            "--out", str(out), "--no-progress"]
    assert cli.main(args) == 0
    return out


@pytest.fixture(scope="session")
def lstm_fallbacks_run(tmp_path_factory):
    """`portkit run --stages fallbacks` on the LSTM model for both targets, in its own process (the console
    command's output, exit code and files), the report rebuilt after it: one run for the tests that check that
    command end to end and the tests that open its report (tests/cli/test_cli.py, the browser test)."""
    out = tmp_path_factory.mktemp("lstm_fallbacks") / "run"
    done = subprocess.run([sys.executable, "-m", "portkit.cli", "run", "--model", "lstm", "--target", "neuron",
                           "--target", "tpu", "--out", str(out), "--stages", "fallbacks", "--no-progress",
                           "-p", "batch_size", "2", "-p", "seq_len", "16"],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    return out, done


def pytest_configure(config):
    config.portkit_started = time.time()
    if config.pluginmanager.hasplugin("nbval"):
        _fork_nbval_kernels()


def _fork_nbval_kernels():
    """nbval's notebook kernels forked from portkit's fork server, as a run's are (portkit.run.kernel_forks): a
    notebook's kernel then starts with torch, transformers and the stages imported, instead of a new interpreter
    importing them. Nothing else changes: each notebook still gets a kernel of its own, with an empty namespace,
    and a kernel forking cannot give is launched as nbval launches it (kernel_forks.forkable says when).
    nbval starts its kernels with nbval.kernel.KernelManager; jupyter_client keeps a provisioner it finds set
    (KernelManager.pre_start_kernel creates one only where there is none), restarts included."""
    import nbval.kernel
    from portkit.run import kernel_forks

    class ForkingKernelManager(nbval.kernel.KernelManager):
        def start_kernel(self, **kwargs):
            self.provisioner = self.provisioner or kernel_forks.provisioner(self)
            return super().start_kernel(**kwargs)

    nbval.kernel.KernelManager = ForkingKernelManager


def pytest_unconfigure(config):
    shutil.rmtree(SESSION_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(session, config, items):
    """Tests marked after_notebooks read what the notebooks wrote in this session: run them last."""
    late = [item for item in items if item.get_closest_marker("after_notebooks")]
    items[:] = [item for item in items if item not in late] + late
