"""Every class of bad input to `portkit run`, as one table: each case exits 2 with one line on stderr that
names the bad value, shows no traceback, and writes nothing. All of them fail in the plan step (no
notebook runs), so the table is fast. The classes are listed in docs/guides/bad-input.md.

A case is (id, command line, files to make first, text the error line holds). The test runs in a fresh
folder that is also the working directory, so the relative paths below are the user's relative paths.
Files: name -> bytes, DIR (a folder), an int (a sparse file of that many bytes), or Link(target) (a symlink).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import ROOT
from portkit import cli
from portkit.corpora import corpus

DIR = object()


class Link(str):
    """A symbolic link to this target (a loop where it names itself)."""

OUT = "run"   # the --out of every case that is not about --out


def run(*args, out: str = OUT) -> list[str]:
    return ["run", "--no-progress", "--out", out, *args]


FACTORY = b"import torch\n\ndef build():\n    return torch.nn.Linear(2, 2)\n"

META_FACTORY = b"import torch\n\ndef build():\n    with torch.device('meta'):\n        return torch.nn.Linear(2, 2)\n"
INT_FACTORY = (b"import torch\n\nclass Ints(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
               b"        self.lin = torch.nn.Linear(2, 2)\n\n    def forward(self, input_ids, attention_mask):\n"
               b"        return 3\n\ndef build():\n    return Ints()\n")

CASES = [
    # the command line itself (argparse)
    ("command-unknown", ["frobnicate"], {}, "invalid choice: 'frobnicate'"),
    ("option-unknown", ["run", "--no-such-flag"], {}, "unrecognized arguments: --no-such-flag"),
    ("option-missing-value", ["run", "--model"], {}, "argument --model: expected one argument"),
    ("param-missing-value", ["run", "-p", "batch_size"], {}, "argument -p/--param: expected 2 arguments"),
    # model: unknown, would need a download, malformed
    ("model-unknown", run("--model", "gpt5"), {}, "unknown model 'gpt5'; choose one of: minilm, gpt2"),
    ("model-empty", run("--model", ""), {}, "unknown model ''; choose one of: minilm"),
    ("model-hub-id", run("--model", "org/some-model"), {}, "model 'org/some-model' looks like a Hugging Face Hub id"),
    ("model-url", run("--model", "https://example.org/m"), {}, "model 'https://example.org/m' looks like"),
    ("model-missing-folder", run("--model", "./nowhere"), {}, "invalid model directory './nowhere': no such folder"),
    ("model-folder-no-config", run("--model", "m1"), {"m1": DIR}, "invalid model directory 'm1': it holds no config.json"),
    ("model-folder-bad-config", run("--model", "m2"), {"m2": DIR, "m2/config.json": b"{not json"},
     "invalid model directory 'm2': its config.json is not JSON (line 1"),
    ("model-file-missing", run("--model", "missing.py:build"), {}, "invalid model factory file 'missing.py': no such file"),
    ("model-file-not-python", run("--model", "broken.py:build"), {"broken.py": b"def build(:\n"},
     "invalid model factory file 'broken.py': not valid Python (line 1"),
    ("model-factory-unknown", run("--model", "mine.py:nope"), {"mine.py": FACTORY},
     "unknown factory in mine.py 'nope'; choose one of: build"),
    ("model-factory-empty", run("--model", "mine.py:"), {"mine.py": FACTORY}, "invalid model factory name ''"),
    ("model-module-missing", run("--model", "no_such_module_xyz:build"), {},
     "invalid model module 'no_such_module_xyz': no module 'no_such_module_xyz'"),
    ("model-abstract-seq", run("--model", "llama3-8b", "--stages", "xla", "-p", "scale_seq", "9000"), {},
     "invalid seq 9000: llama3-8b takes at most 8192 tokens"),
    ("model-abstract-topology", run("--model", "tiny-llama", "-p", "scale_topologies", '["v5e:3x3"]'), {},
     "unknown TPU topology 'v5e:3x3'; choose one of: v5e:1x1"),
    # target
    ("target-unknown", run("--target", "trn"), {}, "unknown target 'trn'; choose one of: neuron, tpu, cpu, cuda"),
    ("target-empty", run("--target", ""), {}, "unknown target ''; choose one of: neuron"),
    # stage
    ("stage-unknown", run("--stages", "fallback"), {}, "unknown stage 'fallback'; choose one of: fallbacks"),
    ("stage-list-empty", run("--stages", ","), {}, "unknown stage list ','; choose one of: fallbacks"),
    # parameter names
    ("param-unknown", run("-p", "batchsize", "4"), {}, "unknown parameter 'batchsize'; choose one of:"),
    ("param-shared", run("-p", "model", "gpt2"), {}, "invalid parameter 'model': give model with its own option"),
    ("param-of-unselected-stage", run("--stages", "fallbacks", "-p", "bucket_count", "3"), {},
     "unknown parameter 'bucket_count'; choose one of: batch_size"),
    # parameter values: wrong type, out of range, not a choice
    ("int-negative", run("-p", "batch_size", "-3"), {}, "invalid batch_size -3: must be a positive whole number"),
    ("int-zero", run("-p", "batch_size", "0"), {}, "invalid batch_size 0: must be a positive whole number"),
    ("int-text", run("-p", "batch_size", "abc"), {}, "invalid batch_size 'abc': must be a positive whole number"),
    ("int-fraction", run("-p", "batch_size", "2.5"), {}, "invalid batch_size 2.5: must be a positive whole number"),
    ("int-boolean", run("-p", "seq_len", "True"), {}, "invalid seq_len True: must be a positive whole number"),
    ("int-above-maximum", run("--stages", "compile", "-p", "requests", "5000"), {},
     "invalid requests 5000: must be at most 2000"),
    ("seed-negative", run("-p", "seed", "-1"), {}, "invalid seed -1: must be a whole number >= 0"),
    ("bool-text", run("-p", "train", "yes"), {}, "invalid train 'yes': must be True or False"),
    ("float-zero", run("--stages", "buckets", "-p", "warmup_budget_seconds", "0"), {},
     "invalid warmup_budget_seconds 0: must be a positive number"),
    ("choice-unknown", run("--stages", "buckets", "-p", "overflow", "wrap"), {},
     "unknown overflow 'wrap'; choose one of: truncate"),
    ("topology-unknown", run("--stages", "xla", "-p", "topology", "v9:1x1"), {},
     "unknown TPU topology 'v9:1x1'; choose one of: v5e:1x1"),
    # corpus: missing, wrong type, not a file, empty, not UTF-8, malformed, wrong column, huge
    ("corpus-missing", run("-p", "corpus", "nowhere.jsonl"), {}, "nowhere.jsonl'; choose one of: stdlib"),
    ("corpus-type", run("-p", "corpus", "texts.parquet"), {"texts.parquet": b"PAR1"},
     "unknown corpus file type '.parquet'; choose one of: .txt, .jsonl, .csv"),
    ("corpus-folder", run("-p", "corpus", "texts.txt"), {"texts.txt": DIR}, "texts.txt': not a file"),
    ("corpus-audio-folder-empty", run("--model", "crepe", "-p", "corpus", "rec"), {"rec": DIR},
     "rec': not a file, nor a folder of .wav/.flac recordings"),
    ("corpus-audio-not-audio", run("--model", "crepe", "-p", "corpus", "rec"), {"rec": DIR, "rec/a.wav": b"RIFFxxxx"},
     "a.wav': cannot read it"),
    ("corpus-images-for-text", run("-p", "corpus", "pics"), {"pics": DIR, "pics/a.png": b"x"},
     "pics': minilm takes text: give a .txt/.jsonl/.csv file"),
    ("corpus-image-unreadable", run("--model", "vit", "-p", "corpus", "pics"), {"pics": DIR, "pics/a.png": b"x"},
     "a.png': cannot be read as an image"),
    ("corpus-empty", run("-p", "corpus", "empty.txt"), {"empty.txt": b""},
     "empty.txt': the file holds no non-empty texts"),
    ("corpus-blank", run("-p", "corpus", "blank.jsonl"), {"blank.jsonl": b"\n  \n\n"},
     "blank.jsonl': the file holds no non-empty texts"),
    ("corpus-not-utf8", run("-p", "corpus", "latin.txt"), {"latin.txt": b"fine\ncaf\xe9\n"},
     "latin.txt': line 2 is not UTF-8 text (byte 0xe9 at column 4)"),
    ("jsonl-not-json", run("-p", "corpus", "a.jsonl"), {"a.jsonl": b'{"text": "ok"}\n{"text": "no\n'},
     "a.jsonl': line 2 is not JSON (Unterminated string starting at column 10)"),
    ("jsonl-not-object", run("-p", "corpus", "b.jsonl"), {"b.jsonl": b'["a", "b"]\n'},
     "b.jsonl': line 1 is a list, not an object with a 'text' field"),
    ("jsonl-column-missing", run("-p", "corpus", "c.jsonl"), {"c.jsonl": b'{"body": "x"}\n'},
     "unknown text column in c.jsonl line 1 'text'; choose one of: body"),
    ("jsonl-column-misnamed", run("-p", "corpus", "d.jsonl", "-p", "text_column", "body"), {"d.jsonl": b'{"text": "x"}\n'},
     "unknown text column in d.jsonl line 1 'body'; choose one of: text"),
    ("jsonl-text-is-number", run("-p", "corpus", "e.jsonl"), {"e.jsonl": b'{"text": "ok"}\n{"text": 42}\n'},
     "e.jsonl': line 2: column 'text' holds a number (42), not text"),
    ("jsonl-text-is-null", run("-p", "corpus", "f.jsonl"), {"f.jsonl": b'{"text": null}\n'},
     "f.jsonl': line 1: column 'text' holds null (None), not text"),
    ("csv-column-missing", run("-p", "corpus", "r.csv"), {"r.csv": b"id,review\n1,great\n"},
     "unknown text column in r.csv 'text'; choose one of: id, review"),
    ("csv-column-of-numbers", run("-p", "corpus", "s.csv", "-p", "text_column", "id"), {"s.csv": b"id,text\n1,a\n2,b\n"},
     "s.csv': column 'id' holds only numbers (first: '1')"),
    ("csv-short-row", run("-p", "corpus", "t.csv"), {"t.csv": b"id,text\n1,fine\n2\n"},
     "t.csv': line 3 has fewer fields than the header"),
    ("corpus-huge", run("-p", "corpus", "huge.txt"), {"huge.txt": corpus.MAX_CORPUS_BYTES + 1},
     f"huge.txt': {corpus.MAX_CORPUS_BYTES + 1:,} bytes, over portkit's limit of {corpus.MAX_CORPUS_BYTES:,}"),
    # --out: empty, not writable, a file, under a file, a folder that is not a run folder
    ("out-empty", run(out=""), {}, "invalid out_dir '': give a folder path"),
    ("out-unwritable", run(out="/proc/portkit-run"), {}, "invalid out folder '/proc/portkit-run': cannot create a folder in /proc"),
    ("out-is-file", run(out="notes.txt"), {"notes.txt": b"mine"}, "notes.txt': it is a file, not a folder"),
    ("out-under-file", run(out="notes.txt/run"), {"notes.txt": b"mine"}, "notes.txt is a file, not a folder"),
    ("out-foreign-folder", run(out="photos"), {"photos": DIR, "photos/cat.jpg": b"\xff\xd8"},
     "photos': it holds files that are not a portkit run's"),
    ("out-symlink-loop", run(out="loop"), {"loop": Link("loop")}, "invalid out_dir 'loop': a symlink loop"),
    # a whole number past its bound (the model's maximum, memory, numpy's seed range): refused in the plan step
    ("int-huge", run("-p", "batch_size", "99999999999999999999999"), {},
     "invalid batch_size 99999999999999999999999: must be at most 4096"),
    ("seq-huge", run("-p", "seq_len", "100000000"), {}, "invalid seq_len 100000000: must be at most 1048576"),
    ("seq-above-model-maximum", run("--stages", "fallbacks", "-p", "seq_len", "1000"), {},
     "invalid seq_len 1000: minilm takes at most 512 tokens"),
    ("seed-above-maximum", run("-p", "seed", "4294967296"), {}, "invalid seed 4294967296: must be at most 4294967295"),
    ("requests-huge", run("--stages", "buckets", "-p", "requests", "10000000"), {},
     "invalid requests 10000000: must be at most 100000"),
    ("lanes-zero", run("--lanes", "0"), {}, "invalid lanes 0: must be a positive whole number"),
    # a message that names what is actually wrong
    ("list-given-text", run("-p", "scale_topologies", "v5e:1x1"), {},
     "invalid scale_topologies 'v5e:1x1': must be a list, not a single value; e.g. -p scale_topologies"),
    ("list-of-text-checked", run("--stages", "xla", "-p", "scale_topologies", '"v5e:1x1"'), {},
     "invalid scale_topologies 'v5e:1x1': must be a non-empty list, not a string"),
    ("json-malformed", run("--stages", "compile", "-p", "precision", '{"tpu": "highest"'), {},
     "invalid precision '{\"tpu\": \"highest\"': malformed JSON (line 1 column 18: Expecting ',' delimiter)"),
    ("model-hub-url", run("--model", "https://huggingface.co/org/name/tree/main"), {},
     "Hugging Face Hub URL (repository org/name), and portkit does not download; fetch it on a machine with network "
     "(hf download org/name --local-dir DIR)"),
    ("corpus-symlink-loop", run("-p", "corpus", "loop.txt"), {"loop.txt": Link("loop.txt")},
     "loop.txt': a symlink loop (too many levels of symbolic links)"),
    ("corpus-broken-symlink", run("-p", "corpus", "gone.txt"), {"gone.txt": Link("nowhere.txt")},
     "gone.txt': a broken symlink (to nowhere.txt)"),
    ("report-on-file", ["report", "notes.txt"], {"notes.txt": b"mine"},
     "invalid run folder 'notes.txt': it is a file, not a folder"),
    ("report-symlink-loop", ["report", "loop"], {"loop": Link("loop")}, "invalid run folder 'loop': a symlink loop"),
    # round three: tracebacks, successes that should have been failures, messages that named the wrong thing
    ("model-config-is-a-list", run("--model", "m3"), {"m3": DIR, "m3/config.json": b"[1, 2]"},
     "invalid model directory 'm3': its config.json is a JSON list, not an object"),
    ("model-factory-on-meta", run("--model", "meta.py:build"), {"meta.py": META_FACTORY},
     "its factory built it on the meta device: 2 tensor(s), first model.weight, have shapes and no values"),
    ("model-forward-returns-int", run("--model", "ints.py:build"), {"ints.py": INT_FACTORY},
     "invalid forward of Ints 'int': forward must return a tensor, a tuple or a dict of tensors"),
    ("model-portkit-module-factory", run("--model", "portkit.models:nonexist"), {},
     "invalid factory in portkit.models 'nonexist': portkit's built-in models are given by name: --model minilm |"),
    ("model-module-no-functions", run("--model", "consts:build"), {"consts.py": b"SIZE = 3\n"},
     "invalid factory in consts 'build': consts defines no public function at its top level"),
    ("model-module-factory-unknown", run("--model", "mods:nope"), {"mods.py": FACTORY},
     "unknown factory in mods 'nope'; choose one of: build"),
    ("out-inside-a-run", run(out="outer/inner"), {"outer": DIR, "outer/.portkit-run": b"a run\n"},
     "inner': it is inside the run folder"),
    ("list-empty", run("--stages", "xla", "-p", "scale_topologies", "[]"), {},
     "invalid scale_topologies []: must be a non-empty list, not an empty one"),
    ("check-junit-unwritable", ["check", "new", "--baseline", "old", "--junit", "/proc/x.xml"], {},
     "invalid --junit file '/proc/x.xml': cannot create a file in /proc"),
    ("check-junit-folder", ["check", "new", "--baseline", "old", "--junit", "reports"], {"reports": DIR},
     "invalid --junit file 'reports': it is a folder; give a file name in it"),
    ("export-target-unknown", ["export", "somerun", "--to", "vllm", "--target", "gpu"], {},
     "unknown target 'gpu'; choose one of: neuron, tpu, cpu, cuda"),
    ("check-baseline-of-another-model", ["check", "new", "--baseline", "old"],
     {"new": DIR, "new/report.json": b'{"model": {"name": "minilm", "kind": "embedding"}, "targets": {}}',
      "old": DIR, "old/report.json": b'{"model": {"name": "gpt2", "kind": "causal-lm"}, "targets": {}}'},
     "invalid baseline 'old': it is a run of gpt2 (causal-lm), the new run one of minilm (embedding)"),
    # an option that takes one value, given twice (argparse would keep the last one)
    ("model-repeated", run("--model", "minilm", "--model", "gpt2"), {},
     "argument --model: given twice ('minilm', then 'gpt2'); give it once"),
    ("out-repeated", ["run", "--out", "a", "--out", "b"], {}, "argument --out: given twice ('a', then 'b')"),
    ("stages-repeated", run("--stages", "fallbacks", "--stages", "compile"), {}, "argument --stages: given twice"),
    ("param-repeated", run("-p", "batch_size", "2", "-p", "batch_size", "4"), {},
     "invalid parameter 'batch_size': given twice (-p batch_size 2, then -p batch_size 4); give it once"),
]


def _make(root: Path, files: dict) -> None:
    for name, content in files.items():
        path = root / name
        if content is DIR:
            path.mkdir(parents=True)
        elif isinstance(content, Link):
            path.symlink_to(content)
        elif isinstance(content, int):
            with open(path, "wb") as handle:
                handle.truncate(content)   # sparse: the size is real, the disk blocks are not
        else:
            path.write_bytes(content)


def _snapshot(root: Path) -> dict[str, tuple]:
    return {str(p.relative_to(root)): (p.is_dir(), None if p.is_dir() else (p.lstat().st_size, p.lstat().st_mtime_ns))
            for p in root.rglob("*")}


def test_the_table_covers_every_class():
    assert len(CASES) >= 30 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("argv,files,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, argv, files, expected):
    monkeypatch.chdir(tmp_path)
    _make(tmp_path, files)
    before = _snapshot(tmp_path)
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:   # argparse's errors leave through exit(), as for the console script
        code = exc.code
    captured = capsys.readouterr()
    assert code == 2, captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("portkit: error: "), captured.err
    assert captured.out == "", captured.out    # the error is the only line: nothing (a target's mode) before it
    assert expected in lines[0]
    assert "Traceback" not in captured.err + captured.out
    assert _snapshot(tmp_path) == before
    assert not (tmp_path / OUT).exists() and not Path("/proc/portkit-run").exists()
    assert os.getcwd() == str(tmp_path)


def test_the_guide_states_the_tables_size():
    """docs/guides/bad-input.md's promise names the size of this table: the figure stays the table's."""
    guide = (ROOT / "docs" / "guides" / "bad-input.md").read_text()
    assert f"`tests/cli/test_bad_input.py`'s table of {len(CASES)}\ncases" in guide
