"""`attnviz serve`: a real server process on a free loopback port, spoken to over real HTTP
(raw sockets, so that bad bytes and `..` paths reach it as sent), and driven in chromium.

One server (with --max-queue 2) serves every slow test of this module, in file order; the
last one stops it with Ctrl-C. Nothing here sends traffic anywhere but 127.0.0.1.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import attnviz
from attnviz.errors import InputError
from attnviz.pipelines.serve import Question
from attnviz.pipelines.serve_compare import CompareQuestion
from attnviz.server import exposed, loopback

SENTENCE = "The animal didn't cross the street because it was too tired."
HOST = "127.0.0.1"
ARTIFACTS = Path(__file__).parent / "artifacts"  # screenshots, gitignored

# A tile equals the API's cells within float32 rounding (tests/test_tiles.py's SAME says why).
SAME = 1e-5


# ---------- without a server ----------


@pytest.mark.parametrize(
    "host, local",
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.20", False),
        ("example.org", False),
    ],
)
def test_only_a_non_loopback_host_is_warned_about(host, local):
    assert loopback(host) is local
    warning = exposed(host, 8000)
    assert (warning is None) is local
    if not local:
        assert "anyone who can reach this machine on port 8000 can use the model" in warning


@pytest.mark.parametrize(
    "body, said",
    [
        ([], "must be a JSON object"),
        ({}, '"text" is missing'),
        ({"text": 3}, '"text" must be a string'),
        ({"text": "  "}, "text is empty"),
        ({"text": "a", "pair": ""}, '"pair" is empty'),
        ({"text": "a", "words": "yes"}, '"words" must be true or false'),
        ({"text": "a", "words": 1}, '"words" must be true or false'),
        ({"text": "a", "layers": 3}, '"layers" must be a list'),
        ({"text": "a", "layers": [True]}, '"layers" must be a list'),
        ({"text": "a", "measure": "nrom"}, "unknown measure 'nrom'"),
        ({"text": "a", "hide_special": True, "measure": "norm"}, "renormalises rows"),
        ({"text": "a", "txet": "b"}, "unknown key 'txet'"),
    ],
)
def test_a_question_refuses_wrong_keys_and_types(body, said):
    with pytest.raises(InputError, match=said):
        Question.of(body)


def test_a_good_question_is_read_as_given():
    asked = Question.of({"text": "a b", "pair": None, "layers": [1, 0], "measure": "alti"})
    assert asked == Question("a b", layers=(1, 0), measure="alti")


@pytest.mark.parametrize(
    "body, said",
    [
        ("A", "must be a JSON object"),
        ({"b": "B"}, '"text" is missing'),
        ({"text": "A"}, '"b" is missing: give text B, or "against_model": true'),
        ({"text": "A", "b": "  "}, '"b" is empty'),
        ({"text": "", "b": "B"}, "text A is empty"),
        ({"text": "A", "b": 3}, '"b" must be a string or null'),
        ({"text": "A", "against_model": "yes"}, '"against_model" must be true or false'),
        (
            {"text": "A", "b": "B", "measure": "rollout"},
            "--measure rollout is not available in attnviz compare",
        ),
        ({"text": "A", "b": "B", "pair": "C"}, "unknown key 'pair'"),
        ({"text": "A", "b": "B", "hide_special": True}, "unknown key 'hide_special'"),
    ],
)
def test_a_compare_question_refuses_wrong_keys_types_and_measures(body, said):
    with pytest.raises(InputError, match=re.escape(said)):
        CompareQuestion.of(body)


def test_a_compare_question_is_read_as_given():
    asked = CompareQuestion.of({"text": "A b", "against_model": True, "measure": "norm"})
    assert asked == CompareQuestion("A b", None, True, measure="norm")


@pytest.mark.slow  # a compare run and a page's answer, seconds each
def test_the_compare_answer_is_compare_htmls_data_from_one_pass(bundled, tmp_path):
    """What /api/compare answers is the data `compare --html` embeds, and both texts (with
    their inside views) take one forward pass."""
    from attnviz.core import models
    from attnviz.core.settings import Load
    from attnviz.pipelines import serve_compare
    from attnviz.pipelines.compare import compare
    from attnviz.pipelines.request import CompareRequest

    a, b = "The keys to the cabinet are on the table.", "The key to the cabinets is on the table."
    model = models.model(None, "cpu")
    passes = []
    embeddings = bundled.model.base_model.get_input_embeddings()
    handle = embeddings.register_forward_hook(lambda *_: passes.append(1))
    try:
        answered = serve_compare.page(model, None, CompareQuestion(a, b))
    finally:
        handle.remove()
    assert len(passes) == 1
    asked = CompareRequest(Load(None, "cpu"), pairs=((a, b),), out=tmp_path, images=False,
                    html=True)  # fmt: skip
    written = compare(asked).pages[0]
    embedded = re.search(
        r'<script type="application/json" id="attnviz-data">(.*?)</script>',
        written.read_text(encoding="utf-8"),
        re.S,
    ).group(1)
    assert json.loads(json.dumps(answered)) == json.loads(embedded)
    with pytest.raises(InputError, match='this server reads one model: give "b"'):
        serve_compare.page(model, None, CompareQuestion(a, against_model=True))


@pytest.mark.slow  # two end-to-end runs of seconds each
def test_the_pages_data_is_show_htmls_from_one_pass(bundled, tmp_path):
    """What /api/page answers is the data `show --html` embeds in its file (here for a pair,
    opening on alti), and it takes one forward pass for every measure and the inside view."""
    options = {"pair": "It was very happy.", "measure": "alti"}
    from attnviz.core import models
    from attnviz.core.settings import Load
    from attnviz.pipelines import serve
    from attnviz.pipelines.request import ShowRequest
    from attnviz.pipelines.show import show

    model = models.model(None, "cpu")
    text = "The cat sat on the mat."
    passes = []
    embeddings = bundled.model.base_model.get_input_embeddings()
    handle = embeddings.register_forward_hook(lambda *_: passes.append(1))
    try:
        answered = serve.page(model, Question(text, **options))
    finally:
        handle.remove()
    asked = ShowRequest(Load(None, "cpu"), text=text, out=tmp_path, images=False, html=True,
                    **options)  # fmt: skip
    written = show(asked).page
    embedded = re.search(
        r'<script type="application/json" id="attnviz-data">(.*?)</script>',
        written.read_text(encoding="utf-8"),
        re.S,
    ).group(1)
    assert json.loads(json.dumps(answered)) == json.loads(embedded)
    assert len(passes) == 1


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def _serve(*options: str, **popen) -> subprocess.Popen:
    command = [sys.executable, "-m", "attnviz", "serve", *options]
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.Popen(command, env=env, text=True, **popen)


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_a_port_in_use_is_one_line_and_exit_2(host):
    """The warning for a public --host, then the port in use: nothing is ever served (the
    port is held on 127.0.0.1, which 0.0.0.0 includes, so the bind fails before loading)."""
    with socket.socket() as holder:
        holder.bind((HOST, 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        done = _serve(
            "--host", host, "--port", str(port), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = done.communicate(timeout=60)
    lines = err.strip().splitlines()
    assert done.returncode == 2, err
    assert (
        lines[-1] == f"error: port {port} is in use on {host}: stop what holds it or pass --port N"
    )
    if host == "0.0.0.0":
        assert lines[0].startswith("warning: --host 0.0.0.0 is not a loopback address: anyone")
        assert len(lines) == 2
    else:
        assert len(lines) == 1
    assert "Traceback" not in err and out == ""


# ---------- a real server ----------


@dataclass
class Server:
    process: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/"


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    process = _serve(
        "--port",
        str(port),
        "--max-queue",
        "2",
        "--hold-mib",
        "8",  # q and k (and the norm's lengths) of up to 448 tokens of the bundled model
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    running = Server(process, port)
    deadline = time.monotonic() + 180  # imports, the model and its first pass, on a busy machine
    while True:
        assert process.poll() is None, f"the server exited: {process.stderr.read()}"
        try:
            if _exchange(port, "GET", "/api/health")[0] == 200:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, "the server did not answer /api/health in 180 s"
        time.sleep(0.25)
    yield running
    if process.poll() is None:
        process.kill()
        process.wait()


def _exchange(
    port: int,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    timeout: float = 60,
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request on its own connection, bytes as given (no client tidies the path
    or the body). The body is sent from a thread, so a server that answers before reading
    all of it (413) is heard. Returns (status, headers in lower case, body)."""
    given = {"Host": f"{HOST}:{port}", "Connection": "close", **(headers or {})}
    if body or method == "POST":
        given.setdefault("Content-Length", str(len(body)))
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in given.items())
    with socket.create_connection((HOST, port), timeout=timeout) as conn:

        def send() -> None:
            try:
                conn.sendall(head.encode("latin-1") + b"\r\n" + body)
            except OSError:  # the server answered and closed before taking it all
                pass

        sender = threading.Thread(target=send)
        sender.start()
        chunks = []
        try:
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
        sender.join()
    received = b"".join(chunks)
    top, _, content = received.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    found = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in found.items()}, content


def _post(server: Server, path: str, found: dict) -> tuple[int, dict]:
    status, _, body = _exchange(
        server.port,
        "POST",
        path,
        json.dumps(found).encode(),
        {"Content-Type": "application/json"},
    )
    return status, json.loads(body)


@pytest.mark.slow
@pytest.mark.parametrize("measure", ["weights", "alti"])
def test_api_attention_is_the_python_apis(server, measure):
    status, answer = _post(server, "/api/attention", {"text": SENTENCE, "measure": measure})
    expected = attnviz.attention(SENTENCE, measure=measure)
    assert status == 200
    assert answer["tokens"] == list(expected.tokens)
    assert answer["special"] == [bool(s) for s in expected.special]
    assert answer["measure"] == measure and answer["per_layer"] is (measure == "alti")
    weights = np.array(answer["weights"])
    assert weights.shape == expected.weights.shape  # (6, 12, T, T), or (6, 1, T, T) for alti
    assert np.abs(weights - expected.weights).max() < 1e-6
    assert answer["model"]["n_heads"] == 12 and answer["notes"] == list(expected.notes)


@pytest.mark.slow
def test_a_long_text_is_refused_naming_the_limit_or_cut(server):
    long = "word " * 600
    status, answer = _post(server, "/api/attention", {"text": long})
    assert status == 400
    assert answer["error"].endswith('this model takes at most 512 (pass "truncate" to cut it)')
    # The page's data, packed small (the same text's weights as JSON numbers are 68 MB).
    status, answer = _post(server, "/api/page", {"text": long, "truncate": True, "layers": [0]})
    assert status == 200 and len(answer["tokens"]) == 512
    assert answer["notes"] == [
        "truncated: kept the first 512 of 602 tokens (text cut after character 2549 of 3000)"
    ]
    # Its q and k (6 × 512 × 24 heads × 32 float32, 9.14 MiB with the norm's lengths) are over
    # this server's --hold-mib 8: no tiles.
    held = (
        "this text's queries and keys are 9.14 MiB (6 layers × 512 tokens × 24 heads × 32 × "
        "4 B), over the 8 MiB the"
    )
    assert answer["tiles"] is None and answer["tiles_note"].startswith(held)
    assert answer["tiles_note"].endswith("server holds for tiles (serve --hold-mib)")
    status, refused = _post(server, "/api/text", {"text": long, "truncate": True})
    assert status == 400 and refused["error"] == answer["tiles_note"]


JSON = {"Content-Type": "application/json"}
BAD = {
    "empty text": ("POST", "/api/attention", b'{"text": ""}', JSON, 400, "text is empty"),
    "10 MB body": ("POST", "/api/attention", b" " * 10_000_000, JSON, 413, "over 65536 bytes"),
    "invalid JSON": ("POST", "/api/attention", b'{"text": ', JSON, 400, "not JSON"),
    "invalid UTF-8": ("POST", "/api/attention", b'{"text": "\xff\xfe"}', JSON, 400, "not UTF-8"),
    "wrong type": ("POST", "/api/attention", b'{"text": ["a"]}', JSON, 400, "must be a string"),
    "not JSON's type": ("POST", "/api/attention", b'{"text": "a"}', {}, 415, "Content-Type"),
    "unknown measure": (
        "POST",
        "/api/page",
        b'{"text": "a", "measure": "nrom"}',
        JSON,
        400,
        "choose one of: weights, norm, alti, rollout",
    ),
    "layer out of range": (
        "POST",
        "/api/attention",
        b'{"text": "a", "layers": [6]}',
        JSON,
        400,
        "layer 6 out of range: this model has layers 0–5",
    ),
    "unknown path": ("GET", "/api/nothing", b"", {}, 404, "no such page"),
    "up and out": ("GET", "/../../etc/passwd", b"", {}, 404, "no such page"),
    "encoded up": ("GET", "/static/..%2f..%2fpyproject.toml", b"", {}, 404, "no such page"),
    "wrong method": ("GET", "/api/attention", b"", {}, 405, "GET is not allowed"),
    "another site's name": ("GET", "/", b"", {"Host": "attacker.example"}, 403, "not this server"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_requests_are_one_json_line_and_the_server_goes_on(server, case):
    method, path, body, headers, expected, said = BAD[case]
    status, found, content = _exchange(server.port, method, path, body, headers)
    assert status == expected, content
    assert found["content-type"] == "application/json"
    assert said in json.loads(content)["error"]
    assert b"root:" not in content and b"[project]" not in content
    assert _exchange(server.port, "GET", "/api/health")[0] == 200


@pytest.mark.slow
def test_the_page_has_the_offline_pages_policy_and_may_fetch_only_its_origin(server):
    status, found, content = _exchange(server.port, "GET", "/")
    policy = found["content-security-policy"]
    assert status == 200 and "default-src 'none'" in policy and "connect-src 'self'" in policy
    in_meta = policy.removesuffix("; frame-ancestors 'none'")  # a header-only directive
    assert f'content="{in_meta}"' in content.decode()
    assert "http://" not in content.decode() and "https://" not in content.decode()


@pytest.mark.slow
def test_a_burst_past_the_queue_is_answered_503_with_retry_after(server):
    """--max-queue 2: of 12 page requests sent at once, some wait and the rest are refused at
    once; every one is answered, /api/health answers meanwhile, and the server serves on."""
    text = " ".join([SENTENCE] * 15)  # ~240 tokens: each request takes a while
    body = json.dumps({"text": text}).encode()
    answers: list[tuple[int, dict]] = []
    start = threading.Barrier(12)

    def ask() -> None:
        start.wait()
        status, found, _ = _exchange(server.port, "POST", "/api/page", body, JSON, timeout=120)
        answers.append((status, found))

    threads = [threading.Thread(target=ask) for _ in range(12)]
    for thread in threads:
        thread.start()
    # The event loop answers while the model thread works: /api/health sees requests queued.
    seen = []
    while any(thread.is_alive() for thread in threads) and len(seen) < 200:
        _, _, health = _exchange(server.port, "GET", "/api/health")  # not `body`: ask() sends it
        seen.append(json.loads(health)["queued"])
    assert max(seen, default=0) >= 1, seen
    for thread in threads:
        thread.join(timeout=150)
    statuses = sorted(status for status, _ in answers)
    assert len(answers) == 12 and set(statuses) == {200, 503}, statuses
    assert all(found.get("retry-after") == "1" for status, found in answers if status == 503)
    assert _exchange(server.port, "GET", "/api/health")[0] == 200


def _opened(browser, url: str):
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    errors, requests = [], []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(url)
    return page, errors, requests


@pytest.mark.slow
def test_typing_a_sentence_shows_it_and_its_url_opens_it_again(server, browser):
    page, errors, requests = _opened(browser, server.url)
    page.fill("#text", SENTENCE)
    page.press("#text", "Enter")
    page.wait_for_selector("body[data-ready='1'] section#view-head", timeout=60_000)
    tokens = page.locator(".tokens.q .token").all_text_contents()
    assert tokens == list(attnviz.attention(SENTENCE).tokens)
    assert page.text_content("#history li") == SENTENCE
    page.click("#tab-matrix")
    page.wait_for_selector("section#view-matrix")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "serve-matrix.png"))
    shared = page.url
    assert urllib.parse.parse_qs(shared.split("#", 1)[1])["text"] == [SENTENCE]
    page.close()
    assert errors == [] and {r.split("#")[0] for r in requests} == {
        server.url,
        server.url + "api/page",
    }

    again, errors, _ = _opened(browser, shared)
    again.wait_for_selector("body[data-ready='1'] section#view-matrix", timeout=60_000)
    assert again.input_value("#text") == SENTENCE
    assert again.get_attribute("body", "data-text") == SENTENCE
    again.close()
    assert errors == []


@pytest.mark.slow
def test_a_refused_text_says_why_on_the_page(server, browser):
    page, errors, _ = _opened(browser, server.url)
    page.fill("#text", "   ")
    page.press("#text", "Enter")
    page.wait_for_selector("#status.error", timeout=60_000)
    assert page.text_content("#status") == (
        "error: text is empty: give a sentence with at least one word"
    )
    page.close()
    assert errors == [
        "Failed to load resource: the server responded with a status of 400 (Bad Request)"
    ]


@pytest.mark.slow
def test_a_second_text_compares_and_its_url_opens_the_same_view(server, browser):
    a, b = "The keys to the cabinet are on the table.", "The key to the cabinets is on the table."
    page, errors, requests = _opened(browser, server.url)
    page.fill("#text", a)
    page.fill("#b", b)
    page.press("#text", "Enter")
    page.wait_for_selector("body[data-ready='1'] #side", timeout=60_000)
    assert page.input_value("#side") == "diff"  # the compare page opens on B − A
    page.click("#tab-matrix")
    page.wait_for_selector("section#view-matrix")
    page.select_option("#layer", "3")
    page.wait_for_selector("#view-matrix .hint >> text=Layer 3, head 0")
    page.select_option("#head", "1")
    page.wait_for_selector("#view-matrix .hint >> text=Layer 3, head 1")
    expected = attnviz.compare(a, b).pairs[0]
    assert f"JS divergence {expected.divergence[3, 1]:.4f} nats" in page.inner_text("#view-matrix")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "serve-compare.png"))
    shared = page.url
    asked = urllib.parse.parse_qs(shared.split("#", 1)[1])
    assert asked["text"] == [a] and asked["b"] == [b] and asked["side"] == ["diff"]
    assert page.text_content("#history li") == f"{a} ⇄ {b}"
    page.close()
    assert errors == [] and {r.split("#")[0] for r in requests} == {
        server.url,
        server.url + "api/compare",
    }

    again, errors, _ = _opened(browser, shared)
    again.wait_for_selector("body[data-ready='1'] section#view-matrix", timeout=60_000)
    assert again.input_value("#text") == a and again.input_value("#b") == b
    assert (
        again.input_value("#side"),
        again.input_value("#layer"),
        again.input_value("#head"),
    ) == (
        "diff",
        "3",
        "1",
    )
    again.select_option("#side", "b")  # the side is kept in the address too
    again.wait_for_function("location.hash.includes('side=b')")
    again.close()
    assert errors == []


# ---------- tiles: the held text's exact cells ----------


def _tile_values(answer: dict) -> np.ndarray:
    if answer["packed"]:
        found = np.frombuffer(base64.b64decode(answer["values"]), "<f4")
        return found.reshape(answer["shape"]).astype(np.float64)
    return np.array([[np.nan if v is None else v for v in row] for row in answer["values"]])


LONG = " ".join([SENTENCE] * 20)  # 281 tokens


@pytest.mark.slow
def test_a_served_tile_is_the_same_cells_as_the_api(server):
    """/api/text holds the text; /api/tile answers its cells, as JSON numbers or packed, at
    the edges of the matrix and inside it; /api/health says what is held."""
    status, read = _post(server, "/api/text", {"text": LONG})
    assert status == 200, read
    held = read["tiles"]
    n = len(read["tokens"])
    per_token = 24 * 32 * 4 + 12 * 4  # q and k of 12 + 12 heads of 32, the norm's lengths
    assert held["tokens"] == n and held["layers"] == 6 and held["bytes"] == 6 * n * per_token
    health = json.loads(_exchange(server.port, "GET", "/api/health")[2])
    assert health["held"] == held
    for measure in ("weights", "norm"):
        api = attnviz.attention(LONG, measure=measure)
        assert read["tokens"] == list(api.tokens)
        for layer, head, (q0, q1, k0, k1), packed in [
            (0, 0, (0, n, 0, n), True),
            (5, 11, (n - 1, n, 0, n), False),
            (3, 7, (40, 90, 200, n), True),
            (2, 1, (0, 1, n - 1, n), False),
        ]:
            status, tile = _post(server, "/api/tile", {
                "text_id": held["text_id"], "layer": layer, "head": head, "q0": q0, "q1": q1,
                "k0": k0, "k1": k1, "measure": measure, "packed": packed})  # fmt: skip
            assert status == 200, tile
            assert tile["shape"] == [q1 - q0, k1 - k0] and tile["pool"] is None
            expected = api.pattern(layer, head)[q0:q1, k0:k1]
            assert np.abs(_tile_values(tile) - expected).max() <= SAME * max(1, expected.max())
    # Pooling asked where the range fits the tile's side (512): the exact cells, not pooled.
    status, tile = _post(server, "/api/tile", {"layer": 1, "head": 2, "pool": "mean"})
    assert status == 200 and tile["block"] == [1, 1] and tile["pool"] is None
    expected = attnviz.attention(LONG, layers=[1]).pattern(1, 2)
    assert np.abs(_tile_values(tile) - expected).max() <= SAME


@pytest.mark.slow
def test_the_served_numbers_are_transformers_eager_ones(server):
    """/api/attention's weights, and a held text's tiles, equal transformers' own eager
    output_attentions of the bundled model, loaded apart from attnviz (the tests above
    hold the server to attention(), whose pipeline it runs)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from attnviz.core.models import bundled_model_path

    path = bundled_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()

    def eager(text: str) -> np.ndarray:
        with torch.inference_mode():
            out = model(**tokenizer(text, return_tensors="pt"), output_attentions=True)
        return torch.stack(out.attentions)[:, 0].numpy()  # (L, H, T, T)

    status, answer = _post(server, "/api/attention", {"text": SENTENCE})
    assert status == 200, answer
    assert np.abs(np.array(answer["weights"]) - eager(SENTENCE)).max() <= SAME
    status, read = _post(server, "/api/text", {"text": LONG})
    assert status == 200, read
    theirs, n = eager(LONG), len(read["tokens"])
    assert theirs.shape == (6, 12, n, n)
    for layer, head, packed in ((0, 3, True), (5, 11, False)):
        status, tile = _post(server, "/api/tile", {
            "text_id": read["tiles"]["text_id"], "layer": layer, "head": head, "q0": 0,
            "q1": n, "k0": 0, "k1": n, "packed": packed})  # fmt: skip
        assert status == 200, tile
        assert np.abs(_tile_values(tile) - theirs[layer, head]).max() <= SAME


TILE_BAD = {
    "outside the matrix": ({"layer": 0, "head": 0, "q1": 9999}, 400,
                           'the tile is outside the matrix: "q1" is 9999 and this text has'),
    "layer out of range": ({"layer": 6, "head": 0}, 400,
                           "layer 6 out of range: this model has layers 0–5"),
    "head out of range": ({"layer": 0, "head": -1}, 400,
                          "head -1 out of range: this model has heads 0–11"),
    "q0 ≥ q1": ({"layer": 0, "head": 0, "q0": 7, "q1": 3}, 400, '"q0" must be less than "q1"'),
    "not an integer": ({"layer": 0, "head": 0, "k0": 2.5}, 400, '"k0" must be a whole number'),
    "a string": ({"layer": "0", "head": 0}, 400, '"layer" must be a layer number'),
    "per layer": ({"layer": 0, "head": 0, "measure": "rollout"}, 400, "rollout has one map"),
    "another text": ({"layer": 0, "head": 0, "text_id": "0123456789abcdef"}, 409,
                     'the server holds another text now'),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("case", TILE_BAD, ids=list(TILE_BAD))
def test_a_bad_tile_is_one_json_line(server, case):
    body, expected, said = TILE_BAD[case]
    assert _post(server, "/api/text", {"text": SENTENCE})[0] == 200
    status, found, content = _exchange(
        server.port, "POST", "/api/tile", json.dumps(body).encode(), JSON
    )
    assert status == expected, content
    assert found["content-type"] == "application/json"
    error = json.loads(content)["error"]
    assert said in error and "\n" not in error and "Traceback" not in error


@pytest.mark.slow
def test_a_bounded_burst_of_tiles_is_answered_and_the_server_goes_on(server):
    """120 tile requests from 6 threads at once (every one with a timeout, the whole burst
    within 240 s): each is answered 200 with the cells asked, or 503 past --max-queue 2;
    the server serves on, and the held text is the one read."""
    status, read = _post(server, "/api/text", {"text": LONG})
    held = read["tiles"]["text_id"]
    api = attnviz.attention(LONG).weights
    n = len(read["tokens"])
    answers: list[tuple[int, dict, tuple]] = []
    start = threading.Barrier(6)
    deadline = time.monotonic() + 240

    def ask(worker: int) -> None:
        start.wait()
        for k in range(20):
            if time.monotonic() > deadline:
                return
            layer, head, q0 = (worker + k) % 6, (3 * worker + k) % 12, (17 * k) % (n - 64)
            asked = {"text_id": held, "layer": layer, "head": head, "q0": q0, "q1": q0 + 64,
                     "k0": 0, "k1": n, "packed": True}  # fmt: skip
            status, _, body = _exchange(server.port, "POST", "/api/tile",
                                        json.dumps(asked).encode(), JSON, timeout=60)  # fmt: skip
            answers.append((status, json.loads(body), (layer, head, q0)))

    threads = [threading.Thread(target=ask, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=250)
    assert not any(thread.is_alive() for thread in threads)
    statuses = [status for status, _, _ in answers]
    assert len(answers) == 120 and set(statuses) <= {200, 503} and 200 in statuses, statuses
    for status, answer, (layer, head, q0) in answers:
        if status == 200:
            expected = api[layer, head, q0 : q0 + 64]
            assert np.abs(_tile_values(answer) - expected).max() <= SAME
        else:
            assert answer["error"].startswith("busy:")
    health = json.loads(_exchange(server.port, "GET", "/api/health")[2])
    assert health["held"]["text_id"] == held and health["queued"] == 0


@pytest.mark.slow
def test_zooming_into_the_matrix_asks_exact_tiles_and_the_url_keeps_the_place(server, browser):
    """In the matrix view a drag over the map zooms into the region: the server's tile
    shows its exact cells (the tooltip's weight is attention()'s, to its 6 digits, where the
    whole map of 281 tokens carries 8-bit steps), the address keeps layer, head and region,
    and opening that address lands on the same cells; ←/→ keeps the region for the next head;
    "whole map" goes back."""
    api = attnviz.attention(LONG)
    n = len(api.tokens)
    address = f"{server.url}#" + urllib.parse.urlencode(
        {"text": LONG, "view": "matrix", "layer": 4, "head": 2}
    )
    page, errors, requests = _opened(browser, address)
    page.wait_for_selector("body[data-ready='1'] section#view-matrix #matrix-over", timeout=60_000)
    assert "Drag over the map to zoom" in page.inner_text("#view-matrix .hint")
    box = page.locator("#matrix-over").bounding_box()
    cell = box["width"] / n
    at = lambda i, j: (box["x"] + (j + 0.5) * cell, box["y"] + (i + 0.5) * cell)  # noqa: E731
    page.mouse.move(*at(100, 30))
    page.mouse.down()
    page.mouse.move(*at(120, 40))
    page.mouse.move(*at(139, 59))
    page.mouse.up()
    page.wait_for_selector("#tile[data-q0='100']", timeout=60_000)
    region = {k: page.get_attribute("#tile", f"data-{k}") for k in ("q0", "q1", "k0", "k1")}
    assert region == {"q0": "100", "q1": "140", "k0": "30", "k1": "60"}
    assert "every cell exact" in page.inner_text("#tile-hint")
    shared = urllib.parse.parse_qs(page.url.split("#", 1)[1])
    place = [shared[k][0] for k in ("layer", "head", "q0", "q1", "k0", "k1")]
    assert place == ["4", "2", "100", "140", "30", "60"]

    def hovered(opened, i: int, j: int) -> float:
        """The weight the tooltip gives for query i, key j of the region (6 digits)."""
        frame = opened.locator("#matrix-over").bounding_box()
        side = frame["width"] / 30  # 30 keys across
        opened.mouse.move(frame["x"] + (j - 30 + 0.5) * side, frame["y"] + (i - 100 + 0.5) * side)
        weight = opened.locator("#tooltip .weight")
        where = weight.get_attribute("data-query"), weight.get_attribute("data-key")
        assert where == (str(i), str(j))
        said = weight.text_content()
        assert said.startswith("weight ") and "≈" not in said
        return float(said.removeprefix("weight "))

    def same(shown: float, expected: float) -> bool:  # printed to 6 digits; SAME says why
        return abs(shown - expected) <= SAME * max(abs(expected), 1e-3)

    assert same(hovered(page, 117, 44), api.pattern(4, 2)[117, 44])
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "serve-zoom.png"))
    # A script reads another text meanwhile: the page's next tile is answered 409, and the
    # page reads its text again for tiles (/api/text) and asks once more.
    assert _post(server, "/api/text", {"text": SENTENCE})[0] == 200
    page.keyboard.press("ArrowRight")  # the next head, the same region
    page.wait_for_selector("#tile-hint >> text=head 3: queries 100–139 × keys 30–59")
    assert same(hovered(page, 117, 44), api.pattern(4, 3)[117, 44])
    health = json.loads(_exchange(server.port, "GET", "/api/health")[2])
    assert health["held"]["tokens"] == n  # the page's text again
    url = page.url
    page.click("#zoom-whole")
    page.wait_for_selector("#view-matrix .hint >> text=Drag over the map to zoom")
    assert "q0=" not in page.url
    page.check("#words")  # the page's own view of words: no tiles of it, and it says why
    page.press("#text", "Enter")
    page.wait_for_selector("#view-matrix .hint >> text=No zoom: zooming shows the model's tokens")
    page.close()
    # The one error is the browser's note of the 409 the page then got past.
    assert errors == [
        "Failed to load resource: the server responded with a status of 409 (Conflict)"
    ]
    assert {r.split("#")[0] for r in requests} == {
        server.url,
        *(server.url + f"api/{route}" for route in ("page", "tile", "text")),
    }

    again, errors, _ = _opened(browser, url)
    again.wait_for_selector("body[data-ready='1'] #tile[data-q0='100']", timeout=60_000)
    assert (again.input_value("#layer"), again.input_value("#head")) == ("4", "3")
    assert same(hovered(again, 117, 44), api.pattern(4, 3)[117, 44])
    assert not same(hovered(again, 118, 44), api.pattern(4, 3)[117, 44])  # the check can fail
    again.close()
    assert errors == []


@pytest.mark.slow  # a second server, on two tiny models
def test_a_server_with_a_second_model_compares_the_two(tiny_model_dirs, tmp_path):
    """serve -m A --against-model B: one text through both, as `attnviz compare` reads it;
    B differs from A in layer 1 head 2's W_Q only, so layer 0 does not move at all."""
    from conftest import perturbed_copy

    first = tiny_model_dirs["bert"]
    changed = perturbed_copy(first, tmp_path / "changed", layer=1, head=2)
    port = _free_port()
    options = ["-m", str(first), "--against-model", str(changed), "--port", str(port)]
    process = _serve(*options, "--device", "cpu", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, f"the server exited: {process.stderr.read()}"
            try:
                if _exchange(port, "GET", "/api/health")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the server did not answer in 180 s"
            time.sleep(0.25)
        running = Server(process, port)
        text = "the cat sat on the mat and the dog sat on the log"
        status, answer = _post(running, "/api/compare", {"text": text, "against_model": True})
        assert status == 200, answer
        expected = attnviz.compare(text, model=str(first), against_model=str(changed), device="cpu")
        moved = np.array(answer["compare"]["divergence"])
        assert np.allclose(moved, expected.divergence, atol=1e-7)
        assert (moved[0] == 0).all() and moved[1, 2] == moved.max() > 0
        assert answer["compare"]["models"][0] != answer["compare"]["models"][1]
        health = json.loads(_exchange(port, "GET", "/api/health")[2])
        assert health["against_model"] == answer["compare"]["models"][1]
    finally:
        process.kill()
        process.wait()


def test_a_second_model_of_another_shape_is_refused_at_start(tiny_model_dirs):
    from typer.testing import CliRunner

    from attnviz.cli import app
    from attnviz.core.models import bundled_model_path

    args = ["serve", "-m", str(tiny_model_dirs["bert"]), "--against-model",
            str(bundled_model_path()), "--port", str(_free_port()), "--device", "cpu"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "has 2 layers × 4 heads" in result.output
    assert "compare needs models of the same shape" in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_ctrl_c_stops_the_server_with_130_and_one_line(server):
    """Last in this module: the shared server gets SIGINT."""
    server.process.send_signal(signal.SIGINT)
    _, err = server.process.communicate(timeout=60)
    assert server.process.returncode == 130
    lines = err.strip().splitlines()
    assert lines[-1] == "interrupted: the server stopped"
    assert lines[0].startswith(f"attnviz serve: {server.url}")
    assert len(lines) == 2 and "Traceback" not in err
