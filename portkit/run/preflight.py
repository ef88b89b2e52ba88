"""A run's plan: every check a run makes before it writes anything (values, the model spec, the corpus files'
content, the user's model factory, the run folder), every path made absolute: the notebooks run in notebooks/, not
where the user typed it.

    >>> from portkit.run import preflight
    >>> stages, per_stage = preflight.plan("minilm", ["neuron"], "runs/minilm", {"batch_size": 4})

A run folder is one holding MARKER (written by every run) or only files a run writes; `portkit run` refuses any
other non-empty folder, and a folder inside another run's folder.
"""
from __future__ import annotations

import importlib
import sys
import os
import tempfile
from pathlib import Path

from portkit.core import checks
from portkit.core.errors import BadParameter, PortkitError
from portkit.corpora import audio
from portkit.corpora.corpus import check_folder_for, image_channels, is_folder, load_corpus, resolve_corpus
from portkit.corpora import images
from portkit.run import notebook_parameters
from portkit.runfolder.layout import MARKER, Stage, is_run_folder
from portkit.stages import options

def plan(model: str, targets, out_dir: str, user_params: dict, stages=None):
    """Validate everything a run needs, writing nothing (one empty folder is created and removed to prove
    the run folder writable). Returns (stages, per-stage params), every path in them absolute."""
    chosen = notebook_parameters.select_stages(stages)
    declared = notebook_parameters.all_parameters(chosen)
    for name in user_params:
        if name in options.SHARED:
            raise BadParameter("parameter", name, hint=f"give {name} with its own option, not -p")
        if name not in declared:
            raise BadParameter("parameter", name, sorted(n for n in declared if n not in options.SHARED))
    user_params = dict(user_params)
    if "corpus" in user_params:
        user_params["corpus"] = resolve_corpus(user_params["corpus"])
    # model and out come back absolute; the targets' mode lines wait until the whole plan holds (run prints them)
    model, names, out = options.common(model, targets, out_dir, announce=False)
    per_stage = []
    for stage in chosen:
        mine = notebook_parameters.declared_parameters(stage)
        values = {"model": model, "targets": names, "out_dir": str(out)}
        values.update({k: v for k, v in user_params.items() if k in mine})
        _preflight(stage, values)
        per_stage.append((stage, values))
    loaded = _Loaded(model)
    _check_sizes(per_stage, user_params, loaded)
    _check_corpora(per_stage, loaded)
    _check_memory(per_stage, user_params, loaded)
    _probe_factory(loaded)
    _probe_directory(loaded)
    check_out_dir(out)   # last: its probe is the one step that touches the disk
    return chosen, per_stage



def _preflight(stage: Stage, values: dict) -> None:
    """Check the stage's options (its notebook's defaults overridden by the user's values) and its rules on the
    run's targets, before anything is written."""
    chosen = importlib.import_module(stage.module).Options.of(values, model=values.get("model"))
    chosen.check_targets(values["targets"])


class _Loaded:
    """The run's model, loaded in the plan step only where a check needs it (once)."""

    def __init__(self, spec: str):
        self.spec, self._model = spec, None

    def get(self):
        if self._model is None:
            from portkit.models import registry
            self._model = registry.load(self.spec)
        return self._model


SEQ_PARAMETERS = ("seq_len",)   # tokens of a batch's every text: at most the model's maximum


def _check_sizes(per_stage, user_params: dict, loaded: _Loaded) -> None:
    """A sequence length the user gave is at most the model's own maximum (its max_position_embeddings): the
    model is loaded for it, where it is one with weights and takes tokens."""
    from portkit.models import meta_device
    given = {name: user_params[name] for name in SEQ_PARAMETERS if name in user_params}
    if not given or meta_device.is_name(loaded.spec):
        return
    try:
        model = loaded.get()
    except Exception:   # noqa: BLE001 (a model that does not build fails in its first stage, which shows how)
        return
    if model.seq_dim != "tokens":
        return
    for name, value in given.items():
        if value > model.max_length:
            raise BadParameter(name, value, hint=f"{model.name} takes at most {model.max_length} tokens")


MEMORY_PARAMETERS = ("batch_size", "seq_len")   # what sizes stage 4's main batch


def _check_memory(per_stage, user_params: dict, loaded: _Loaded) -> None:
    """Stage 4's main batch against the machine's memory where the user sized it (MEMORY_PARAMETERS; the defaults are
    measured to fit every built-in model, benchmarks/bench_memory.py): a batch that cannot fit the machine is
    BadParameter naming the batch_size that fits (accuracy.stage.check_memory); one beyond the memory available now
    is a warning on stderr, since what other processes hold changes. A model that does not build, or a batch that
    cannot be made, is left to the stage, whose notebook shows why."""
    from portkit.models import meta_device
    chosen = [values for stage, values in per_stage if stage.name == "accuracy"]
    if not chosen or not set(MEMORY_PARAMETERS) & set(user_params) or meta_device.is_name(loaded.spec):
        return
    from portkit.stages.accuracy.stage import check_memory
    try:
        model = loaded.get()
        warning = check_memory(model, chosen[0])
    except BadParameter:
        raise
    except Exception:   # noqa: BLE001 (the stage meets the same error and shows where)
        return
    if warning:
        print(f"portkit: warning: {warning}", file=sys.stderr)


def _check_corpora(per_stage, loaded: _Loaded) -> None:
    """Read each corpus file a stage will read, with its text column: a bad line fails here, not mid-run.
    A folder is checked against the model's kind of data (the model is loaded for it: folders only)."""
    checked = set()
    for stage, values in per_stage:
        declared = notebook_parameters.declared_parameters(stage)
        if "corpus" not in declared:
            continue
        corpus = values.get("corpus", notebook_parameters.default(declared, "corpus"))
        column = values.get("text_column", notebook_parameters.default(declared, "text_column"))
        if corpus == "stdlib" or (corpus, column) in checked:
            continue
        if is_folder(corpus):
            check_folder_for(loaded.get(), corpus)
        if is_folder(corpus) and audio.holds_audio(Path(corpus).expanduser()):
            audio.folder_corpus(corpus)      # every file's header read: an unreadable one fails here
        elif is_folder(corpus):
            images.check_folder(corpus)      # likewise every image's header
        else:
            load_corpus(corpus, column)
        checked.add((corpus, column))


PROBE_TEXT = "A short text to probe the model's forward."


def _probe_factory(loaded: _Loaded) -> None:
    """A model from the user's factory (module:factory, file.py:factory) is built in the plan step and called once
    on one item: a model whose weights are on the meta device (shapes, no values) and a forward that returns
    something other than a tensor, a tuple or a dict fail here in one line, not mid-stage. A factory or a forward
    that raises is left to stage 1, whose notebook shows where."""
    import torch
    from portkit.models import inputs
    if ":" not in loaded.spec:
        return
    try:
        model = loaded.get()     # a factory returning the wrong type is BadParameter: it stops here
    except PortkitError:
        raise
    except Exception:   # noqa: BLE001 (a factory that raises: stage 1's notebook shows where)
        return
    meta = [name for name, t in [*model.module.named_parameters(), *model.module.named_buffers()] if t.is_meta]
    if meta:
        raise BadParameter("model", loaded.spec, hint=f"its factory built it on the meta device: {len(meta)} "
                           f"tensor(s), first {meta[0]}, have shapes and no values (no weights); build it with its "
                           "weights, or give a real-size model without weights as its config folder "
                           "(docs/guides/real-size.md)")
    try:
        declaration = model.declaration
        own = declaration.own_items() if declaration.own_items else None
        items = own[:1] if own else {inputs.TEXT: [PROBE_TEXT]}.get(declaration.data)
        if items is None and declaration.data == inputs.IMAGE and model.image_size:
            items = images.sample_images(1, model.image_size, 0, channels=image_channels(model))
        batch = model.encode(list(items)) if items is not None else None
    except Exception:   # noqa: BLE001 (no items to probe with: the stages build their own batches)
        return
    if batch is None:
        return
    try:
        with torch.no_grad():
            out = model.module(**batch)
    except PortkitError:
        raise
    except Exception:   # noqa: BLE001 (stage 1 shows the forward's error where it is raised)
        return
    if not isinstance(out, (torch.Tensor, tuple, list, dict)):
        raise BadParameter(f"forward of {model.name}", type(out).__name__,
                           hint="forward must return a tensor, a tuple or a dict of tensors")


PROBE_BATCH = 2   # items in the probe's batch: 2, as a model may take no single row (a group norm over 1x1 maps)


def _probe_directory(loaded: _Loaded) -> None:
    """An image or audio model from a directory (or the Hub) is called once on a batch of the inputs portkit builds
    for its task (its adapter over its own processor): a model that raises on them cannot be assessed by any stage,
    so it is refused here in one line, naming what it raised and where, and the inputs its processor makes that
    portkit does not feed. Text models are not loaded for this (every text model takes input_ids and
    attention_mask, and a large one would load twice); a model that does not build is left to stage 1."""
    from portkit.models import huggingface, meta_device
    from portkit.corpora.corpus import corpus_for, example_batch
    if ":" in loaded.spec or meta_device.is_name(loaded.spec):
        return
    path = Path(loaded.spec).expanduser()
    if not path.is_dir() and huggingface.is_hub_id(loaded.spec):
        path = huggingface.resolve(loaded.spec).path
    if not path.is_dir() or not (path / "config.json").is_file():
        return
    try:
        model = loaded.get()
    except PortkitError:
        raise
    except Exception:   # noqa: BLE001 (a model that does not build: stage 1's notebook shows where)
        return
    if model.takes_text:
        return
    try:
        batch, _ = example_batch(model, corpus_for(model), PROBE_BATCH, 0)
    except PortkitError:
        raise
    except Exception as exc:  # noqa: BLE001 - the directory's processor raising on portkit's items is the answer
        raise huggingface.processor_refusal(loaded.spec, exc, f"the {PROBE_BATCH} {model.declaration.items}") from None
    raised = model.raises_eagerly(batch)
    if raised is None:
        return
    where = f" at {raised['where']['text']}" if raised.get("where") else ""
    unfed = sorted(set(huggingface.processor_input_names(path)) - set(model.input_names))
    also = (f"; its processor also makes {', '.join(unfed)}, which portkit does not feed" if unfed else "")
    raise BadParameter("model directory", loaded.spec,
                       hint=f"it raises on the inputs portkit builds for it ({', '.join(model.input_names)}: "
                            f"{PROBE_BATCH} items through its own processor): {raised['message']}{where}{also}; "
                            "declare it with --model file.py:build returning a LoadedModel "
                            "(docs/guides/declaring-a-model.md)")


def check_out_dir(out: Path) -> None:
    """The run folder is a new folder that can be created, or a run folder that can be written."""
    what = "out folder"
    if out.is_symlink() and not out.exists():   # a loop or a broken link: mkdir would fail mid-run
        raise BadParameter(what, str(out), hint=checks.missing_path(out))
    if out.exists() and not out.is_dir():
        raise BadParameter(what, str(out), hint="it is a file, not a folder")
    _refuse_inside_a_run(out)
    if out.is_dir():
        try:
            foreign = not is_run_folder(out)
        except OSError as exc:
            raise BadParameter(what, str(out), hint=f"cannot list it ({exc.strerror})") from None
        if foreign:
            raise BadParameter(what, str(out), hint="it holds files that are not a portkit run's; give a new or "
                                                    f"empty folder, or a run folder (one holding {MARKER})")
        base = out
    else:
        base = next(parent for parent in out.parents if parent.exists())
        if not base.is_dir():
            raise BadParameter(what, str(out), hint=f"{base} is a file, not a folder")
    # os.access answers yes to root everywhere, and some file systems (/proc) refuse all the same:
    # create and remove an empty folder to know.
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".portkit-probe-", dir=base))
    except OSError as exc:
        raise BadParameter(what, str(out), hint=f"cannot create a folder in {base} ({exc.strerror})") from None


def _refuse_inside_a_run(out: Path) -> None:
    """A run folder is never made inside another run's folder (one holding MARKER): the outer run's rerun, report
    and export would meet a folder that is not theirs, and removing one run would remove the other."""
    outer = next((parent for parent in out.parents if (parent / MARKER).is_file()), None)
    if outer is not None:
        raise BadParameter("out folder", str(out), hint=f"it is inside the run folder {outer} (which holds {MARKER}); "
                                                        "give a folder outside any run")


