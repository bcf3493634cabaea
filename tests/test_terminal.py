"""Terminal views rendered into a plain console: golden output."""

from __future__ import annotations

import io
import re
from collections import Counter

import numpy as np
import pytest
from rich.console import Console

from attnviz.analysis.summary import summarise
from attnviz.outputs import terminal
from tests.conftest import synthetic_attention


def _console(width=100):
    return Console(width=width, file=io.StringIO(), color_system=None, legacy_windows=False)


def _attention():
    # One layer, two heads over [CLS] a b [SEP]: head 0 attends to the previous token,
    # head 1 mostly to [CLS].
    prev = np.array([[1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]], float)
    sink = np.array([[0.7, 0.1, 0.1, 0.1]] * 4)
    return synthetic_attention(
        np.stack([prev, sink])[None], ["[CLS]", "a", "b", "[SEP]"], special=[1, 0, 0, 1]
    )


def test_detail_table_golden():
    att = _attention()
    console = _console()
    terminal.print_head_details(console, att, summarise(att, [0], [0, 1], top_k=2))
    # Head 0: queries a and b look at the previous token (1.00); keys averaged over a and b:
    # [CLS] (1 + 0) / 2, a (0 + 1) / 2. Head 1: 0.7 on [CLS] from every query.
    assert [line.rstrip() for line in console.file.getvalue().splitlines()] == [
        "What each head does on this text",
        "┏━━━┳━━━┳━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┓",
        "┃ L ┃ H ┃ does                 ┃ top keys (mean weight) ┃ strongest link (query → key) ┃",
        "┡━━━╇━━━╇━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┩",
        "│ 0 │ 0 │ previous-token 1.00  │ [CLS] .50 · a .50      │ b → a 1.00                   │",
        "│ 0 │ 1 │ first-token sink .70 │ [CLS] .70 · a .10      │ a → a .10                    │",
        "└───┴───┴──────────────────────┴────────────────────────┴──────────────────────────────┘",
    ]


def test_head_map_reports_special_share_and_each_heads_pattern():
    att = _attention()
    console = _console()
    terminal.print_head_map(console, att, summarise(att, [0], [0, 1]), [0], [0, 1])
    out = console.file.getvalue()
    # Head 0's queries a and b send 1 and 0 to [CLS]; head 1's send 0.7 + 0.1 to specials.
    assert "Special tokens take 65% of attention on average (50%–80% per head)" in out
    lines = out.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("L0"))
    assert lines[row].split() == ["L0", "prev", "[CLS]"]
    assert lines[row + 1].split() == ["1.00", ".70"]


def test_head_map_fits_80_columns_at_512_tokens():
    rng = np.random.default_rng(0)
    n = 512
    weights = rng.random((2, 12, n, n))
    weights[0, 0] = np.eye(n, k=-1)  # previous token ([CLS], first, looks at itself)
    weights[0, 0, 0, 0] = 1.0
    weights /= weights.sum(-1, keepdims=True)
    tokens = ["[CLS]", *(f"w{i}" for i in range(n - 2)), "[SEP]"]
    att = synthetic_attention(weights, tokens, special=[1] + [0] * (n - 2) + [1])
    console = _console(width=80)
    terminal.print_header(console, att)
    terminal.print_head_map(console, att, summarise(att, [0, 1], list(range(12))), [0, 1],
                            list(range(12)))  # fmt: skip
    lines = console.file.getvalue().splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    assert "… 432 more (--json lists all) …" in " ".join(lines)
    row = next(i for i, line in enumerate(lines) if line.startswith("L0"))
    assert lines[row].split()[1] == "prev" and lines[row + 1].split()[0] == "1.00"
    assert len(lines[row].split()) == 13  # L0 and 12 cells, none lost


def test_heatmap_shades_without_colour():
    att = _attention()
    console = _console()
    assert terminal.print_heatmap(console, att, 0, 0)
    rows = [line for line in console.file.getvalue().splitlines() if line[:3].strip().isdigit()]
    assert rows[2].endswith("  " + "██" + "  " + "  ")  # token b (row 2) attends to a (column 1)
    assert rows[0].split()[-1] == "██"


def test_heatmap_too_wide_says_so():
    att = synthetic_attention(np.full((1, 1, 60, 60), 1 / 60), [f"t{i}" for i in range(60)])
    console = _console(width=80)
    assert not terminal.print_heatmap(console, att, 0, 0)
    message = " ".join(console.file.getvalue().split())
    assert "heatmap of 60 tokens needs 128 columns and this terminal has 80" in message


def test_colour_ramp_ends():
    assert terminal.colour(0.0) == "#440154" and terminal.colour(1.0) == "#fde725"


def _run_in_pty(args, env_extra, columns=100):
    """Run attnviz in a real pseudo-terminal (as a user's shell would) and return its output."""
    import os
    import pty
    import shutil
    import subprocess
    import sys

    controller, terminal_side = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env.update(TERM="xterm-256color", COLUMNS=str(columns), COLORTERM="truecolor", **env_extra)
    exe = shutil.which("attnviz", path=os.path.dirname(sys.executable))
    process = subprocess.Popen(
        [exe, *args], stdin=terminal_side, stdout=terminal_side, stderr=terminal_side, env=env
    )
    os.close(terminal_side)
    chunks = []
    while True:
        try:
            data = os.read(controller, 65536)
        except OSError:  # the other side closed
            break
        if not data:
            break
        chunks.append(data)
    process.wait(timeout=60)
    os.close(controller)
    return process.returncode, b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.slow  # a real process, started, signalled or killed
def test_no_color_in_a_real_terminal_draws_shades():
    from concurrent.futures import ThreadPoolExecutor

    args = ["show", "Birds sing loudly.", "--no-images", "-l", "0", "-H", "2"]
    with ThreadPoolExecutor(2) as both:  # side by side: each spends its time starting up
        runs = [both.submit(_run_in_pty, args, env) for env in ({}, {"NO_COLOR": "1"})]
        (code, coloured), (plain_code, plain) = (run.result() for run in runs)
    assert code == 0
    assert "\x1b[48;2;" in coloured  # truecolor background blocks in a real terminal
    assert plain_code == 0
    assert "\x1b[48;" not in plain and "\x1b[38;" not in plain
    rows = [line for line in plain.splitlines() if line[:3].strip().isdigit()]
    assert rows and all(any(ch in line for ch in "░▒▓█") for line in rows)


def test_wide_terminals_get_wider_cells():
    n = 6
    weights = np.zeros((1, 12, n, n))
    weights[..., 5] = 1.0  # every head attends to the last token
    tokens = ["[CLS]", "extraordinarily", "long", "words", "here", "photosynthesis"]
    att = synthetic_attention(weights, tokens, special=[1, 0, 0, 0, 0, 0])
    heads = list(range(12))
    summaries = summarise(att, [0], heads)
    shown = {}
    for width in (80, 140, 200):
        console = _console(width)
        terminal.print_head_map(console, att, summaries, [0], heads)
        row = next(line for line in console.file.getvalue().splitlines() if line[:2] == "L0")
        shown[width] = row.split()[1]
    assert shown == {80: "phot…", 140: "photosynt…", 200: "photosynthesis"}


def test_repeated_tokens_carry_their_position():
    n = 5
    weights = np.zeros((1, 1, n, n))
    weights[..., 3] = 1.0  # every query attends to the second "the" (position 3)
    att = synthetic_attention(weights, ["[CLS]", "the", "cat", "the", "[SEP]"], [1, 0, 0, 0, 1])
    console = _console()
    terminal.print_head_map(console, att, summarise(att, [0], [0]), [0], [0])
    assert "the@3" in console.file.getvalue()
    console = _console()
    terminal.print_header(console, att)
    assert "the@1 cat the@3" in console.file.getvalue()


@pytest.mark.parametrize("width", [80, 200])
def test_check_errors_show_every_number_whole(width):
    """30 layers × 9 heads (SmolLM2's shape) do not fit as columns: layers go in rows and the
    columns are split over tables, every error printed in full."""
    from attnviz.analysis.check import CheckResult, LayerCheck
    from attnviz.core.model_info import ModelInfo

    info = ModelInfo("m", "LlamaForCausalLM", "llama", 30, 9, 576, 64, 2048, True, 3)
    rng = np.random.default_rng(1)
    errors = rng.uniform(1e-8, 9e-6, size=(30, 10))
    layers = tuple(LayerCheck(i, tuple(errors[i, :9]), float(errors[i, 9])) for i in range(30))
    result = CheckResult(info, ("a", "b"), 1e-5, layers, (("X", "input", (2, 576)),))
    console = _console(width)
    terminal.print_check(console, result)
    out = console.file.getvalue()
    assert max(len(line) for line in out.splitlines()) <= width
    assert "…" not in out
    for value in errors.ravel():
        assert f"{value:.1e}" in out
    # each layer's row holds its own numbers
    row = next(line for line in out.splitlines() if line.startswith("│ L17 "))
    assert f"{errors[17, 0]:.1e}" in row


def test_check_errors_keep_layers_as_columns_when_they_fit():
    from attnviz.analysis.check import CheckResult, LayerCheck
    from attnviz.core.model_info import ModelInfo

    info = ModelInfo("m", "BertModel", "bert", 6, 12, 384, 32, 512, False)
    layers = tuple(LayerCheck(i, (1e-7,) * 12, 2e-7) for i in range(6))
    console = _console(100)
    terminal.print_check(console, CheckResult(info, ("a",), 1e-5, layers, ()))
    lines = console.file.getvalue().splitlines()
    header = next(line for line in lines if "L0" in line)
    assert header.split() == ["┃", "┃", *(x for i in range(6) for x in (f"L{i}", "┃"))]
    assert sum(line.startswith("│ head ") for line in lines) == 12 and "…" not in "".join(lines)


def test_a_removed_head_shows_a_mark_not_a_pattern():
    """--ablate 0.0 removes head 0, the previous-token head: the map marks it (no role, no
    score) and says what the mark means; the details row and the terminal heatmap say it is
    removed instead of showing its top keys, link and cells."""
    from dataclasses import replace

    att = replace(_attention(), removed=((0, 0),))
    summaries = summarise(att, [0], [0, 1])
    console = _console()
    terminal.print_head_map(console, att, summaries, [0], [0, 1])
    lines = console.file.getvalue().splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("L0"))
    assert lines[row].split() == ["L0", "✗", "[CLS]"]
    assert lines[row + 1].split() == [".70"]  # head 1's score alone
    assert "✗=removed (--ablate" in " ".join(lines)
    # the share of special tokens leaves the removed head out: head 1's 80% alone
    assert "80% of attention on average (80%–80% per head)" in " ".join(lines)
    console = _console()
    terminal.print_head_details(console, att, summaries)
    details = console.file.getvalue()
    assert "✗ removed (--ablate)" in details and "previous-token" not in details
    console = _console()
    terminal.print_heatmap(console, att, 0, 0)
    drawn = console.file.getvalue()
    assert "removed (--ablate)" in drawn and "█" not in drawn
    plain = _console()
    terminal.print_head_map(plain, _attention(), summarise(_attention(), [0], [0, 1]), [0], [0, 1])
    assert "prev" in plain.file.getvalue() and "✗" not in plain.file.getvalue()


def _guesses_view():
    """A decoder's --ablate view as SmolLM2 gives it: long tokens, five guesses a side."""
    from attnviz.analysis.ablation import AblationView, Prediction

    before = (("afterlife", 0.06), ("key", 0.05), ("throne", 0.04), ("best", 0.02), (" ", 0.02))
    after = (("most", 0.02), ("key", 0.02), ("keys", 0.02), ("code", 0.02), ("right", 0.01))
    predictions = tuple(
        Prediction(p, f" token{p}", f" next{p}", before[p:] + before[:p], after[p:] + after[:p])
        for p in range(5)
    )
    return AblationView(((3, 0),), "zero", "loss", "nats", 2.5, 2.6, predictions)


@pytest.mark.parametrize("width", [80, 100, 60])
def test_ablation_guesses_never_split_a_token_from_its_probability(width):
    """At 80 columns the top-5 lists wrap, between one guess and the next: every
    "token probability" pair stays on one line, and every guess is there."""
    view = _guesses_view()
    console = _console(width)
    terminal.print_ablation(console, view)
    lines = console.file.getvalue().splitlines()
    assert max(len(line.rstrip()) for line in lines) <= width
    table = "\n".join(lines[2:])  # below the loss line and the title
    expected = Counter(
        f"{token.strip() or repr(token)} {prob:.2f}"
        for p in view.predictions
        for token, prob in (*p.before, *p.after)
    )
    for shown, count in expected.items():  # whole, on one line, as often as it is a guess
        found = re.findall(rf"(?<!\S){re.escape(shown)}(?!\S)", table)
        assert len(found) == count, (width, shown, len(found), count)


def _importance_report(scores, gradient=None):
    """A report of one model's head importance (and gradient), built by hand."""
    from attnviz.analysis.importance import Importance
    from attnviz.analysis.report import Report
    from attnviz.analysis.roles import HeadRole, Thresholds

    att = _attention()
    n_layers, n_heads = scores.shape

    def result(values, method):
        return Importance(values, 2.0, "mean loss", "next-token-loss", "nats", method,
                          "zero" if method == "ablation" else None, 3, tuple(range(n_layers)),
                          tuple(range(n_heads)), "next-token loss")  # fmt: skip

    roles = tuple(HeadRole(layer, head, "mixed", None) for layer in range(n_layers)
                  for head in range(n_heads))  # fmt: skip
    second = None if gradient is None else result(gradient, "gradient")
    return Report(att.info, "token", 3, 20, (), np.zeros((1, n_layers, n_heads)), roles,
                  Thresholds(), att, tuple(range(n_layers)), tuple(range(n_heads)),
                  importance=result(scores, "ablation"), importance_gradient=second)  # fmt: skip


# Scores over four orders of magnitude, as the bundled model's 1 − cos spans (0.10 … 0.008).
IMPORTANCE = np.array([[0.1039, 0.066, 0.03727, 0.02912], [0.01983, 0.008926, 0.0005432, -0.26]])


def _one_format(shown: list[str], values: list[float]) -> None:
    """One number of decimals for the whole column, each number its value to that many
    places, the smallest non-zero value with three significant digits."""
    places = {len(text.partition(".")[2]) for text in shown}
    assert len(places) == 1, shown
    (d,) = places
    for text, value in zip(shown, values):
        assert float(text) == pytest.approx(value, abs=0.51 * 10**-d), (text, value)
    smallest = min(abs(v) for v in values if v)
    assert smallest * 10**d >= 100, (shown, d)  # three significant digits at least


def test_importance_table_gives_each_column_one_number_format():
    gradient = IMPORTANCE[::-1, ::-1] * 3
    report = _importance_report(IMPORTANCE, gradient)
    console = _console()
    terminal.print_importance(console, report)
    rows = [line.split() for line in console.file.getvalue().splitlines()]
    rows = [row for row in rows if row and row[0].isdigit()]
    top = report.importance.top(10)
    assert len(rows) == len(top) == 8
    for column, values in ((-2, IMPORTANCE), (-1, gradient)):
        _one_format([row[column] for row in rows], [values[layer, head] for layer, head, _ in top])


def test_report_md_importance_table_gives_each_column_one_number_format():
    from attnviz.outputs.report_files import _importance_section

    report = _importance_report(IMPORTANCE)
    lines = _importance_section(report, {})
    rows = [line.strip("|").split("|") for line in lines if line.startswith("| ") and "·" in line]
    top = report.importance.top(15)
    assert len(rows) == len(top)
    _one_format(
        [row[-1].strip() for row in rows], [IMPORTANCE[layer, head] for layer, head, _ in top]
    )


def test_decimals_follow_the_smallest_magnitude():
    from attnviz.outputs.numbers import column, decimals

    assert decimals([0.1039, 0.01023]) == 4  # 0.0102: three significant digits
    assert decimals([12.5, 31.25]) == 2  # never fewer than two places
    assert decimals([1e-9]) == 6  # never more than six
    assert decimals([0.0, float("nan")]) == 2  # nothing to go by
    assert column([0.1039, 0.066, 0.008117]) == ["0.10390", "0.06600", "0.00812"]


def _legend(text: str) -> set[str]:
    """The role names a legend lists: the NAME of each `short=NAME` entry."""
    joined = " ".join(text.split())
    return set(re.findall(r"(?:^|\s)\S+=([a-z][a-z-]*(?: sink)?)", joined))


def _roles_report(causal: bool, probed: bool):
    from dataclasses import replace

    from attnviz.analysis.probes import ProbeResult

    report = _importance_report(IMPORTANCE)
    info = replace(report.info, causal=causal)
    probes = ProbeResult(np.zeros((2, 2, 4)), 5.0, 1.0, 4, 20) if probed else None
    return replace(report, info=info, probes=probes, importance=None)


@pytest.mark.parametrize(
    ("causal", "probed", "listed", "left_out"),
    [
        (False, False, {"next-token", "previous-token"}, {"induction"}),
        (True, True, {"induction", "previous-token"}, {"next-token"}),
        (True, False, {"previous-token"}, {"induction", "next-token"}),  # a seq2seq decoder
    ],
)
def test_report_legend_lists_the_roles_the_models_kind_can_get(causal, probed, listed, left_out):
    """The bundled encoder's report listed induc=induction, which encoders never get; a
    decoder's listed next=next-token, which a causal query cannot see."""
    console = _console()
    terminal.print_report(console, _roles_report(causal, probed))
    names = _legend(console.file.getvalue())  # its one legend
    assert listed <= names and not names & left_out, names
    assert "mixed" in names


@pytest.mark.parametrize(
    ("kind", "listed", "left_out"),
    [
        ("encoder", {"next-token", "local"}, {"induction"}),
        ("decoder", {"induction", "previous-token"}, {"next-token"}),
        ("cross", {"first-token sink", "broad"}, {"previous-token", "local", "induction"}),
    ],
)
def test_show_map_legend_follows_the_registry(kind, listed, left_out):
    from dataclasses import replace

    from attnviz.analysis.roles import roles_for
    from attnviz.core.attention import Keys

    att = _attention()
    att = replace(att, info=replace(att.info, causal=kind == "decoder"))
    if kind == "cross":
        source = ("<s>", "x", "y", "</s>")
        keys = Keys("x y", source, np.array([1, 0, 0, 1], bool), (0, 1, 2, 3), source)
        att = replace(att, keys=keys)
    console = _console()
    terminal.print_head_map(console, att, summarise(att, [0], [0, 1]), [0], [0, 1])
    names = _legend(console.file.getvalue().split("What each head")[1])
    assert names - {"mixed"} == {role.name for role in roles_for(kind)}
    assert listed <= names and not names & left_out, names
