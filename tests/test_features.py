"""The one table of what combines (`attnviz.pipelines.features`): every row against every
model kind and every command, exclusions, one wording, and refusals before the weights load."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.errors import InputError
from attnviz.pipelines import features
from attnviz.pipelines.features import COMMAND_KINDS, DECODER, ENCODER, EVERY, FEATURES, SEQ2SEQ
from attnviz.pipelines.request import (
    COMMANDS,
    REQUESTS,
    CompareRequest,
    ExportRequest,
    ReportRequest,
    Request,
    ShowRequest,
)

runner = CliRunner()

# What makes each feature given: one row here per row of the table (a new row needs one).
ASKING = {
    "pair": dict(pair="It rained."),
    "target": dict(target="Es regnete."),
    "generate": dict(generate=5),
    "sample": dict(generate=5, sample=True),
    "temperature": dict(generate=5, sample=True, temperature=0.7),
    "seed": dict(generate=5, sample=True, seed=1),
    "stack": dict(stack="encoder"),  # the decoder's stacks need a target (test_seq2seq.py)
    "layers": dict(layers=(0,)),
    "all-layers": dict(all_layers=True),
    "heads": dict(heads=(0,)),
    "treebank": dict(treebank=True),
    "words": dict(words=True),
    "hide-special": dict(hide_special=True),
    "measure-norm": dict(measure="norm"),
    "measure-composed": dict(measure="alti"),
    "query": dict(query="it"),
    "ablate": dict(ablate=((0, 1),)),
    "window": dict(window=(2, 9)),
    "pool-mean": dict(pool="mean"),
    "no-tower": dict(tower=False, picture="photo.png", prompt="What is it?"),  # a prompt's
    "html": dict(html=True),
    "page-measure": dict(html=True, measure="norm"),
    "importance": dict(importance="ablation"),
    "mean-ablation": dict(importance="ablation", ablation="mean"),
    "shard": dict(shard="0/2"),
    "launched": dict(launched=True),
    "partial": dict(resume=True, shard="0/2"),
}
FACTS = {
    ENCODER: SimpleNamespace(name="enc", seq2seq=False, causal=False),
    # a decoder that also reads a picture and a prompt (a vision-language model's language
    # model): text reads it alike
    DECODER: SimpleNamespace(name="dec", seq2seq=False, causal=True, prompted=True),
    SEQ2SEQ: SimpleNamespace(name="s2s", seq2seq=True, causal=False),
}


def _request(command: str, fields: dict) -> Request | None:
    """`command`'s request asking for `fields`, or None where its class has not them all (an
    option the command does not have)."""
    try:
        return REQUESTS[command](**fields)
    except TypeError:
        return None


def test_every_row_has_a_way_to_ask_for_it():
    assert set(ASKING) == set(FEATURES)
    for name, fields in ASKING.items():
        for command in FEATURES[name].where:  # each command offering it has its fields
            request = _request(command, fields)
            assert request is not None, (name, command)
            given = [feature.name for feature in features.given(request)]
            assert name in given, (name, command, given)


def test_a_command_has_the_options_it_offers_and_only_those():
    """A command's request has a field exactly where the table (or the command itself: what
    is read, where it goes) offers it: export's has no --ablate, show's no --shard."""
    for name, fields in ASKING.items():
        for command in COMMANDS:
            if _request(command, fields) is None:
                assert command not in FEATURES[name].where, (name, command)
    with pytest.raises(TypeError):
        ExportRequest(ablate=((0, 1),))
    with pytest.raises(TypeError):
        ShowRequest(shard="0/2")


@pytest.mark.parametrize("name", list(FEATURES))
@pytest.mark.parametrize("kind", list(FACTS))
def test_every_row_against_every_model_kind_and_command(name, kind):
    """A request asking for the row's feature (and what it needs: page-measure is --html with
    a measure) runs exactly where every feature it asks for works on that kind of model; else
    the first that does not is named, in one line of the table's wording."""
    for command in COMMANDS:
        request = _request(command, ASKING[name])
        if request is None:  # the command has not the option (the test above)
            continue
        asked = features.given(request)
        offered = [f for f in asked if command not in f.where]
        command_kinds = COMMAND_KINDS.get(command, EVERY)
        wrong_kind = [f for f in asked if command in f.where and kind not in f.where[command]]
        if not offered and kind in command_kinds and not wrong_kind:
            features.refuse(request, FACTS[kind])
            continue
        with pytest.raises(InputError) as refused:
            features.refuse(request, FACTS[kind])
        said = str(refused.value)
        assert "\n" not in said
        if offered:
            assert said.startswith(f"{offered[0].label(request)} is not available in attnviz")
        elif kind not in command_kinds:
            assert said.startswith(f"attnviz {command} works with ")
        else:
            first = wrong_kind[0]
            assert said.startswith(f"{first.label(request)} in attnviz {command} works with ")
            assert f"; {FACTS[kind].name} is a" in said


def test_a_command_not_offering_a_feature_is_refused_without_a_model():
    with pytest.raises(InputError, match="--measure rollout is not available in attnviz compare"):
        features.refuse(CompareRequest(measure="rollout"))
    # a reason given for a kind of model is not said for a command (report's, here)
    with pytest.raises(InputError) as refused:
        features.refuse(CompareRequest(layers=(0,)))
    assert str(refused.value) == "--layer is not available in attnviz compare"


def test_a_misspelt_field_in_a_row_is_raised_not_read_as_not_asked():
    assert not features.asks(lambda r: r.shard is not None, ShowRequest())  # report's option
    with pytest.raises(AttributeError):
        features.asks(lambda r: r.shardd is not None, ShowRequest())


@pytest.mark.parametrize(
    "fields, said",
    [
        (dict(target="x", generate=3), "give either --target or --generate, not both"),
        (dict(layers=(1,), all_layers=True), "give either --layer or --all-layers, not both"),
        (dict(hide_special=True, measure="norm"), "give either --hide-special or --measure norm"),
    ],
)
def test_exclusions_are_refused_whatever_the_model(fields, said):
    command = "check" if "all_layers" in fields else "show"
    for facts in (None, *FACTS.values()):
        with pytest.raises(InputError, match=said):
            features.refuse(REQUESTS[command](**fields), facts)


def test_a_feature_that_needs_another_is_refused_without_it():
    with pytest.raises(InputError, match="--partial/--resume needs --shard or a launched run"):
        features.refuse(ReportRequest(resume=True))
    features.refuse(ReportRequest(resume=True, launched=True))


def test_the_table_imports_nothing_heavy():
    import subprocess
    import sys

    code = (
        "import sys; import attnviz.pipelines.features, attnviz.pipelines.request; "
        "print(any(m in sys.modules for m in ('torch', 'transformers', 'matplotlib')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_each_consumer_named_in_the_table_exists():
    from importlib import import_module

    from attnviz.pipelines.consumers import Consumer

    named = [feature.consumer for feature in FEATURES.values() if feature.consumer]
    assert named
    for path in named:
        module, name = path.split(":")
        assert issubclass(getattr(import_module(module), name), Consumer)


def test_ablate_on_an_encoder_decoder_model_is_refused_before_loading(seq2seq_dirs, monkeypatch):
    from attnviz.core import models

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(models, "load_model", no_load)
    monkeypatch.setattr(models, "_MODELS", {})
    monkeypatch.setattr(models, "_KEPT", models._Kept())
    result = runner.invoke(
        app, ["show", "A cat.", "-m", str(seq2seq_dirs["t5"]), "--ablate", "0.1", "--no-images"]
    )
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        f"error: --ablate in attnviz show works with encoders and decoders (one attention "
        f"stack); {seq2seq_dirs['t5']} is an encoder-decoder model"
    )


@pytest.mark.parametrize(
    "args, said",
    [
        (["show", "hi", "--pair", "ho"], "--pair in attnviz show works with encoders; {gpt2} is a"
         " decoder: the model reads [CLS] text [SEP] pair [SEP]"),
        (["export", "hi", "--stack", "cross"], "--stack cross in attnviz export works with "
         "encoder-decoder models (T5, BART, Marian); {gpt2} is a decoder"),
        (["show", "hi", "--no-tower"], "--no-tower is for a picture and a prompt: it leaves a "
         "vision-language model's vision tower unread; this run reads text"),
    ],
)  # fmt: skip
def test_refusals_of_the_command_line_are_one_line(tiny_model_dirs, tmp_path, args, said):
    gpt2 = str(tiny_model_dirs["gpt2"])
    result = runner.invoke(app, [*args, "-m", gpt2, "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {said.format(gpt2=gpt2)}"
    assert not (tmp_path / "out").exists()


def test_ablate_with_a_picture_and_a_prompt_is_refused_before_loading():
    """It ended in a traceback (a batch of two, where a prompt is read alone)."""
    asked = ShowRequest(picture="photo.png", prompt="What is it?", ablate=((0, 1),))
    for facts in (None, FACTS[DECODER]):
        with pytest.raises(InputError, match="^--ablate does not read a picture and a prompt"):
            features.refuse(asked, facts)
    features.refuse(ShowRequest(picture="photo.png", ablate=((0, 1),)))  # a picture alone
