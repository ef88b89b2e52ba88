"""The task sample's size: why n is what it is, said in the result and the report's text, and n grown to what the
data holds (up to portkit's cap, Scope.task_items_max, owned by accuracy.TASK_ITEMS_MAX) where the chosen
precision's interval straddles its budget. A tiny image classifier on a folder of small PNGs, an agreement budget of
0.95 (perfect agreement clears it from 74 items on) so the samples stay small: seconds."""
import torch
from torch import nn

from portkit.corpora.corpus import corpus_for, example_batch
from portkit.models import inputs
from portkit.models import registry
from portkit.stages.accuracy import stage

from fixtures.images import image_folder

SIZE = 8
OPTIONS = {"task_bounds": {"agreement": 0.95}}


class _Classifier(nn.Module):
    """Four classes far apart on every image: each target's top-1 label equals float32's."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, pixel_values):
        logits = self.conv(pixel_values).mean((2, 3))
        return {"logits": logits + 100 * nn.functional.one_hot(logits.argmax(-1), 4)}


def _model() -> registry.LoadedModel:
    decl = inputs.image_declaration(SIZE, (inputs.Output("logits", inputs.IMAGE_CLASSIFIER),))
    return registry.LoadedModel("tiny-classifier", inputs.IMAGE_CLASSIFIER, _Classifier().eval(), "test",
                              image_size=SIZE, declaration=decl)


def _check(model, corpus, **scope):
    batch, described = example_batch(model, corpus, 2, SIZE, seed=0)
    report = stage.check_accuracy(model, batch, ["tpu"], stage.Options.of(OPTIONS),
                                     corpus=corpus, description=described,
                                     scope=stage.Scope(all_precisions=False, layers=False, compiled=False,
                                                          progress=False, float64_reference=False, **scope))
    return report.targets["tpu"]


def test_an_undecided_sample_grows_to_what_the_folder_holds_and_says_why(tmp_path):
    """Rule: where the interval straddles the budget and the data holds more, n grows to all of it (up to the cap),
    and the sample's text says why n is what it is. 20 agreeing images cannot clear a 0.95 agreement budget
    (Wilson lower bound 0.84); the folder's 90 can (0.959)."""
    model = _model()
    corpus = corpus_for(model, image_folder(tmp_path / "photos", 90, SIZE))
    task = _check(model, corpus, task_items=20).chosen.task
    assert task["decision"] == "pass" and task["checks"][0]["n"] == 90
    assert task["sample"]["items"] == task["sample"]["pool"] == 90
    assert "all 90 the data holds" in task["sample"]["text"]
    assert task["sample"]["text"].endswith("grown from 20: " + task["sample"]["grown_from"].partition(": ")[2])
    assert "straddles" in task["sample"]["grown_from"]


def test_a_decided_sample_stays_and_a_grown_one_stops_at_portkits_cap(tmp_path):
    """Rule: n is the first sample where it decides, said as portkit's choice; a grown sample stops at portkit's
    cap, named as portkit's with the parameter that raises it, and the inconclusive advice points at that cap."""
    model = _model()
    corpus = corpus_for(model, image_folder(tmp_path / "photos", 90, SIZE))
    task = _check(model, corpus, task_items=80).chosen.task       # 80 agreeing images: lower bound 0.954, decided
    assert task["decision"] == "pass" and task["sample"]["items"] == 80 and "grown_from" not in task["sample"]
    assert "of the 90 the data holds: portkit's first sample (Scope.task_items)" in task["sample"]["text"]
    capped = _check(model, corpus, task_items=20, task_items_max=40)
    assert capped.chosen.task["decision"] == "inconclusive" and capped.chosen.task["sample"]["items"] == 40
    assert "portkit's cap on a grown sample (Scope.task_items_max, 40)" in capped.chosen.task["sample"]["text"]
    (finding,) = capped.findings()
    assert "raise portkit's cap on the task sample (Scope.task_items_max)" in finding.advice
