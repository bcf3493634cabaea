"""Vision-language models (issue 54): a picture and a prompt read in one pass by attnviz's
attention function, held to each family's eager attention; each image token on the cell
of the picture its processor cut it from; bad input refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner
from vlm_models import CROSS, FAMILIES, LAID, eager, input_of, picture, save

from attnviz.cli import app

PROMPT = "What is on the table?"


@pytest.fixture(scope="module")
def vlm_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm-models")
    return {kind: save(kind, root / kind) for kind in FAMILIES}


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    return picture(tmp_path_factory.mktemp("pictures") / "photo.png", (128, 64))


def _read(folder, path, settings=None):
    """The prompt (with its continuation, `settings`) as attnviz reads it: its tokens and
    every layer's weights, and the processor's inputs beside the ids."""
    from attnviz.core import generation, vlm
    from attnviz.core.extract import attend
    from attnviz.core.models import model

    loaded = model(str(folder)).load()
    prompt = vlm.encode(loaded, path, PROMPT)
    whole, reading = prompt, None
    if settings is not None:
        whole, reading = generation.write(loaded, prompt, settings, range(loaded.info.n_layers))
    return whole, prompt.inputs, attend(loaded, [whole], reading=reading)[0]


@pytest.mark.parametrize("kind", FAMILIES)
@pytest.mark.parametrize("how", ["prompt", "generate", "target"])
def test_every_layer_equals_the_models_eager_attention(vlm_dirs, photo, kind, how):
    from attnviz.core.generation import Settings

    settings = {"prompt": None, "generate": Settings(tokens=3),
                "target": Settings(target="A cat")}[how]  # fmt: skip
    whole, inputs, found = _read(vlm_dirs[kind], photo, settings)
    expected = eager(vlm_dirs[kind], list(whole.ids), inputs)
    assert found.weights.shape == expected.shape  # the language model's layers alone
    assert np.abs(found.weights - expected).max() < 1e-5
    if kind in CROSS:
        assert found.layout is None and "cross-attention" in whole.notes[-1]
    else:
        assert found.layout is not None and len(found.layout.cells()) > 1


def test_the_api_reads_a_picture_and_a_prompt(vlm_dirs, photo):
    import attnviz

    found = attnviz.attention(PROMPT, picture=photo, model=str(vlm_dirs["llava"]), generate=2)
    layout = found.layout
    cells = layout.cells()
    assert found.tokens[cells[0]] == "(0, 0)" and found.tokens[cells[-1]] == "(5, 5)"
    assert found.continuation.start == len(found.tokens) - 2
    assert layout.pixels.shape == (64, 128, 3)
    np.testing.assert_allclose(found.weights.sum(-1)[:, :, 1:], 1.0, atol=1e-5)


# SmolVLM's connector (pixel shuffle) and processor are Idefics3's: its bright patch adds
# 8-12 s and nothing Idefics3's does not show
@pytest.mark.parametrize("kind", [kind for kind in LAID if kind != "smolvlm"])
def test_a_bright_patch_moves_the_token_cut_from_it(tmp_path, kind):
    """With each image token's features made of its own patches alone (`local`), a bright
    square on one cell of a grey picture changes the language model's input at that cell's
    token more than at any other token of its part (of a global view and its tiles, each)."""
    import torch
    from PIL import Image

    from attnviz.core import vlm
    from attnviz.core.models import model

    folder = save(kind, tmp_path / kind, local=True)
    loaded = model(str(folder)).load()
    size = (128, 64)
    grey = np.full((size[1], size[0], 3), 90, np.uint8)
    layout = vlm.encode(loaded, Image.fromarray(grey), PROMPT).layout
    before = _inputs(loaded, Image.fromarray(grey))
    for part in layout.parts:
        rows, cols = part.grid
        top, left, bottom, right = part.box
        ys = (top + (bottom - top) * (np.arange(rows)[:, None] + [0.3, 0.7]) / rows) * size[1]
        xs = (left + (right - left) * (np.arange(cols)[:, None] + [0.3, 0.7]) / cols) * size[0]
        # the cells whose middle is on the picture (LLaVA-NeXT's outer cells reach past it)
        on_y = [r for r in range(rows) if ys[r, 0] >= 0 and ys[r, 1] <= size[1]]
        on_x = [c for c in range(cols) if xs[c, 0] >= 0 and xs[c, 1] <= size[0]]
        inside = [(r, c) for r in on_y for c in on_x]
        assert len(inside) >= rows * cols // 2, part.name
        for row, col in (inside[0], inside[-1], inside[len(inside) // 2]):
            bright = grey.copy()
            (y0, y1), (x0, x1) = np.round(ys[row]).astype(int), np.round(xs[col]).astype(int)
            bright[y0:y1, x0:x1] = 255
            moved = _inputs(loaded, Image.fromarray(bright)) - before
            change = torch.linalg.vector_norm(moved, dim=-1)[list(part.tokens)]
            assert int(change.argmax()) == row * cols + col, (part.name, row, col)


def _inputs(loaded, image):
    """The language model's input embeddings for the prompt about `image`, (T, d)."""
    return input_of(loaded, loaded.model.get_decoder(), image, PROMPT,
                    lambda args, kwargs: kwargs["inputs_embeds"][0])  # fmt: skip


def test_show_generates_over_a_picture(vlm_dirs, photo, tmp_path):
    result = CliRunner().invoke(app, ["show", str(photo), PROMPT, "-m", str(vlm_dirs["qwen2_vl"]),
                                      "--generate", "3", "--no-images"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "3 tokens generated" in result.output
    assert "image tokens over the picture" in result.output
    assert "The picture's share of attention" in result.output


def test_the_pictures_share_is_the_eager_rows_on_the_image_tokens(vlm_dirs, photo):
    from attnviz.analysis.picture_share import picture_shares
    from attnviz.core.generation import Settings

    whole, inputs, found = _read(vlm_dirs["qwen2_vl"], photo, Settings(tokens=3))
    expected = eager(vlm_dirs["qwen2_vl"], list(whole.ids), inputs)
    start, image = found.continuation.start, found.layout.image_tokens()
    by_row = expected[:, :, start - 1 : len(whole.ids) - 1][..., image].sum(-1)  # (L, H, 3)
    shares = picture_shares(found)
    assert shares.rows == tuple(range(start - 1, len(whole.ids) - 1))
    np.testing.assert_allclose(shares.share, by_row.mean(-1), atol=1e-5)
    head, share = shares.top_heads(1)[0]
    assert share == pytest.approx(by_row[1].mean(-1).max(), abs=1e-5)


def _refused(args, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [*map(str, args), "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert not out.exists()  # nothing written
    return result.output.strip()


def test_bad_input_is_one_line_and_exit_2(vlm_dirs, photo, tmp_path, tiny_model_dirs):
    said = _refused(["show", photo, PROMPT, "-m", tiny_model_dirs["gpt2"]], tmp_path)
    assert "is a text model: it reads no picture" in said and "\n" not in said
    two = "<|user|><image><image>What is this?"
    said = _refused(["show", photo, two, "-m", vlm_dirs["llava"], "--raw"], tmp_path)
    assert "holds 2 image tokens" in said and "\n" not in said
    thin = picture(tmp_path / "thin.png", (402, 2))  # Qwen2-VL's: an aspect ratio below 200
    said = _refused(["show", thin, PROMPT, "-m", vlm_dirs["qwen2_vl"]], tmp_path)
    assert "does not take this picture" in said and "aspect ratio" in said
    said = _refused(["show", photo, "-m", vlm_dirs["llava"]], tmp_path)
    assert "give the prompt after the picture" in said


def test_several_pictures_are_refused_in_one_line(vlm_dirs, photo, tmp_path):
    """Several pictures for one prompt: the API says in one line that one is read; the CLI
    takes one picture and one prompt (exit 2, nothing written)."""
    import attnviz
    from attnviz.errors import InputError

    other = picture(tmp_path / "other.png", seed=1)
    with pytest.raises(InputError, match="^2 pictures given: attnviz reads one picture a prompt"):
        attnviz.attention(PROMPT, picture=[photo, other], model=str(vlm_dirs["llava_next"]))
    said = _refused(["show", photo, other, PROMPT, "-m", vlm_dirs["llava_next"]], tmp_path)
    assert "unexpected extra argument" in said and "\n" not in said


def test_text_alone_is_read_with_or_without_the_processor(vlm_dirs, photo, tmp_path):
    """A vision-language model reads text alone through its language model, its processor
    loaded or not; saved without the processor's files (a tokenizer alone), a picture and a
    prompt are refused in one line."""
    import shutil

    import attnviz
    from attnviz.core.vlm import PROCESSOR_FILES

    bare = shutil.copytree(vlm_dirs["llava"], tmp_path / "bare")
    for name in PROCESSOR_FILES:
        (bare / name).unlink(missing_ok=True)
    alone = attnviz.attention(PROMPT, model=str(bare), device="cpu")
    whole = attnviz.attention(PROMPT, model=str(vlm_dirs["llava"]), device="cpu")
    assert alone.tokens == whole.tokens and alone.layout is None
    assert np.abs(alone.weights - whole.weights).max() < 1e-6
    said = _refused(["show", photo, PROMPT, "-m", bare], tmp_path)
    assert "has no processor here" in said and "\n" not in said


def test_a_box_past_the_picture_is_painted_where_it_is_on_it():
    """LLaVA-NeXT's kept cells may reach into the padding around the picture: a grid of two
    cells over rows -2 … 6 of a picture 4 rows high paints each cell's rows on it."""
    from attnviz.core.layouts import Layout, Part

    part = Part("tiles", (0, 1), (2, 1), (-0.5, 0.0, 1.5, 1.0))
    layout = Layout("llava_next", np.zeros((4, 3, 3), np.uint8), (part,))
    painted = layout.painted(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(painted, [[1] * 3, [1] * 3, [2] * 3, [2] * 3])


def test_a_layout_its_reader_does_not_know_is_said_and_the_text_read(vlm_dirs, photo,
                                                                      monkeypatch):  # fmt: skip
    """A family's reader that meets a layout it does not know (image tokens that make no
    grid it reads: a processor set otherwise than the reader's family does) leaves the
    picture's view out with one note saying why; the text is read as any text."""
    from types import SimpleNamespace

    from attnviz.core import layouts

    def unknown(*args):
        raise ValueError("37 image tokens make no square grid")

    monkeypatch.setitem(layouts.BY_TYPE, "llava", SimpleNamespace(read=unknown))
    whole, inputs, found = _read(vlm_dirs["llava"], photo)
    assert found.layout is None
    said = "the picture's view is not drawn for llava: 37 image tokens make no square grid"
    assert said in whole.notes[-1]
    assert np.abs(found.weights - eager(vlm_dirs["llava"], list(whole.ids), inputs)).max() < 1e-5


@pytest.mark.parametrize("kind", ["qwen2_vl", "gemma3"])
def test_eager_attention_reads_the_answer_with_the_prompts_inputs_extended(vlm_dirs, photo, kind):
    """With eager attention the rows are read in one more pass over the prompt and its
    answer, the processor's per-token inputs extended over the answer as `generate` extends
    them (Qwen2-VL's position ids were built from the prompt's alone: a traceback)."""
    from attnviz.core.settings import Load
    from attnviz.pipelines import readers
    from attnviz.pipelines.request import ShowRequest

    load = Load(str(vlm_dirs[kind]), implementation="eager")
    request = ShowRequest(load, text=PROMPT, picture=photo, prompt=PROMPT, generate=2,
                          images=False)  # fmt: skip
    run = readers.run(request, [])
    whole = run.encoded
    assert whole.continuation is not None
    expected = eager(vlm_dirs[kind], list(whole.ids), whole.inputs)
    assert np.abs(run.raw.weights - expected).max() < 1e-5
