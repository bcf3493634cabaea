// attnviz serve's page: a form above page.js's views. A text goes to the server that served
// this page (POST /api/page, the only request it makes), which answers with the same data an
// offline page embeds; page.js's draw() shows it. The URL's hash carries the text and the view
// (#text=…&view=matrix&layer=3), so a view can be bookmarked and shared; Back and Forward go
// through the texts asked. The session's texts are listed on the side. A text B (or, on a
// server with a second model, "read B with it") asks /api/compare instead: the compare page
// of A, B and B − A, whose hash keeps both texts and the side shown (#text=…&b=…&side=diff).
// The server keeps the last text's X: a region dragged in the matrix view is asked as a tile
// (POST /api/tile, exact cells, or pooled past the tile's side), and the hash keeps it
// (&q0=…&q1=…&k0=…&k1=…, half-open, and &pool=mean where not max).
"use strict";

{
  const S = JSON.parse(document.getElementById("attnviz-data").textContent).live;
  const FLAGS = [["words", "words", "merge word pieces into words"],
    ["hide_special", "hide special", "drop [CLS]/[SEP]/BOS and renormalise each row"],
    ["truncate", "truncate", `cut a text past the model's ${S.model.max_tokens} tokens`]];
  const AGAINST = S.against; // the second model's facts (serve --against-model), or null
  // What the server reads (a new request when one changes) and what only the view shows.
  const ASKED = ["text", "pair", "b", "against", "words", "hide_special", "truncate",
    "generate", "target", "sample", "temperature", "seed"];
  const WRITE = ["generate", "target", "temperature", "seed"]; // a decoder's continuation
  const VIEWED = ["measure", "view", "layer", "head", "query"];
  const ZOOM = ["q0", "q1", "k0", "k1"]; // the matrix view's region, kept for the same text

  const make = (tag, props = {}, ...children) => {
    const node = Object.assign(document.createElement(tag), props);
    node.append(...children);
    return node;
  };
  // Each box's name before it: a filled box shows no placeholder.
  const named = (label, box) => make("label", { className: "ask-label", htmlFor: box.id, textContent: label });
  const text = make("input", { id: "text", type: "text", name: "text", autofocus: true,
    placeholder: "Type a sentence and press Enter", autocomplete: "off" });
  const pair = make("input", { id: "pair", type: "text", name: "pair", autocomplete: "off",
    placeholder: "a second sentence (optional): the model reads the pair" });
  const other = make("input", { id: "b", type: "text", name: "b", autocomplete: "off",
    placeholder: "compare with text B (optional): every head of A and B, and B − A" });
  const against = make("input", { type: "checkbox", id: "against" });
  const boxes = Object.fromEntries(FLAGS.map(([key]) => [key, make("input", { type: "checkbox", id: key })]));
  // A decoder continues the text: N tokens it writes (greedy, or sampled), or a given target.
  const writes = {
    generate: make("input", { id: "generate", type: "number", min: 1, max: S.model.max_tokens,
      placeholder: "N", title: "let the model write at most N tokens after the text" }),
    target: make("input", { id: "target", type: "text", autocomplete: "off",
      placeholder: "or a continuation to read (teacher forcing)" }),
    temperature: make("input", { id: "temperature", type: "number", min: 0.01, step: 0.1,
      placeholder: "1", title: "with sample: divide the logits by this before drawing" }),
    seed: make("input", { id: "seed", type: "number", step: 1, placeholder: "seed",
      title: "with sample: the same seed writes the same text" }),
  };
  const sample = make("input", { type: "checkbox", id: "sample" });
  const measure = make("select", { id: "ask-measure" },
    ...Object.entries(S.measures).map(([m, help]) => make("option", { value: m, textContent: m, title: help })));
  const status = make("p", { id: "status", role: "status", className: "hint" });
  const form = make("form", { id: "ask" },
    make("div", { className: "ask-row" }, named("text", text), text,
      make("button", { type: "submit", textContent: "Show" })),
    ...(S.model.causal ? [] : [make("div", { className: "ask-row" }, named("pair", pair), pair)]),
    ...(S.model.causal ? [make("div", { className: "ask-row" }, named("write", writes.generate),
      writes.generate, make("label", { title: "draw each token instead of taking the likeliest" }, sample, " sample"),
      writes.temperature, writes.seed, writes.target)] : []),
    make("div", { className: "ask-row" }, named("compare with", other), other, ...(AGAINST ? [make("label",
      { title: `text B (or text A again, if B is empty) is read by ${AGAINST.name}` }, against,
      ` read B with ${AGAINST.name}`)] : [])),
    make("div", { className: "ask-row options" },
      ...FLAGS.map(([key, label, help]) => make("label", { title: help }, boxes[key], ` ${label}`)),
      make("label", {}, "measure ", measure)),
    status);
  const texts = make("ol");
  const aside = make("aside", { id: "history" }, make("h2", { textContent: "This session" }), texts);
  const app = make("div", { id: "app" }, make("p", { className: "hint", textContent:
    `${S.model.name} (${classes(S.model)}, ${S.model.n_layers} layers × ${S.model.n_heads} heads) ` +
    "is loaded: type a sentence above and press Enter." }));
  document.body.append(make("div", { id: "live" },
    make("header", {}, make("h1", { textContent: `attnviz serve · ${S.model.name}` }), form),
    make("div", { className: "live-body" }, app, aside)));

  // The hash's parameters (URLSearchParams), and the form's question as parameters.
  const params = () => new URLSearchParams(location.hash.slice(1));
  // A comparison asks the server for one measure (the plain page carries them all).
  const comparing = (p) => !!(p.get("b") || p.get("against") === "1");
  const key = (p) => ASKED.map((k) => p.get(k) || "").join("\u0000") +
    (comparing(p) ? `\u0000${p.get("measure") || "weights"}` : "");
  // The view, layer and head stay as they are for a new text; the query (a position) does not.
  function fromForm(viewOf) {
    const p = new URLSearchParams();
    p.set("text", text.value);
    if (pair.value.trim() && !S.model.causal) p.set("pair", pair.value);
    if (other.value.trim()) p.set("b", other.value);
    if (AGAINST && against.checked) p.set("against", "1");
    for (const [k] of FLAGS) if (boxes[k].checked) p.set(k, "1");
    if (measure.value !== "weights") p.set("measure", measure.value);
    for (const k of WRITE) if (S.model.causal && writes[k].value.trim()) p.set(k, writes[k].value.trim());
    if (S.model.causal && sample.checked) p.set("sample", "1");
    for (const k of [...VIEWED.slice(1), "side"]) if (viewOf.has(k)) p.set(k, viewOf.get(k));
    for (const k of [...ZOOM, "pool"]) if (viewOf.has(k)) p.set(k, viewOf.get(k));
    if (key(p) !== key(viewOf)) for (const k of ["query", ...ZOOM]) p.delete(k);
    return p;
  }
  function toForm(p) {
    text.value = p.get("text") || "";
    pair.value = p.get("pair") || "";
    other.value = p.get("b") || "";
    against.checked = p.get("against") === "1";
    for (const [k] of FLAGS) boxes[k].checked = p.get(k) === "1";
    measure.value = p.get("measure") || "weights";
    for (const k of WRITE) writes[k].value = p.get(k) || "";
    sample.checked = p.get("sample") === "1";
  }

  let shown = null; // {key, data}: the text on the page
  let asked = 0; // each request's number: an answer to an older one is dropped
  async function load() {
    const p = params();
    toForm(p);
    if (!p.get("text")) return;
    const number = ++asked;
    const initial = { view: p.get("view"), measure: p.get("measure") || "weights",
      stack: p.get("side") || undefined };
    for (const k of ["layer", "head", "query"]) if (p.has(k)) initial[k] = +p.get(k);
    if (ZOOM.every((k) => p.has(k))) initial.zoom = Object.fromEntries(ZOOM.map((k) => [k, +p.get(k)]));
    if (p.get("pool") === "mean") initial.pool = "mean";
    if (!shown || shown.key !== key(p)) {
      status.textContent = "reading…";
      status.className = "hint";
      const [route, body] = question(p);
      const started = performance.now();
      let answer;
      try {
        if (!body) throw new Error(route);
        const response = await fetch(route, { method: "POST",
          headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
        answer = await response.json();
        if (!response.ok) throw new Error(answer.error || `the server answered ${response.status}`);
      } catch (err) {
        if (number !== asked) return;
        status.textContent = `error: ${err.message}`;
        status.className = "error";
        return;
      }
      if (number !== asked) return;
      shown = { key: key(p), data: answer, tiles: answer.tiles ? tilesOf(p, answer.tiles) : null };
      const counts = answer.compare
        ? `${answer.sides.a.tokens.length} and ${answer.sides.b.tokens.length} ${answer.unit}s (A, B)`
        : `${answer.tokens.length} ${answer.unit}s`;
      status.textContent = `${counts} in ${Math.round(performance.now() - started)} ms` +
        (answer.tiles_note ? ` (no zoom: ${answer.tiles_note})` : "");
      remember(p);
    }
    await draw(shown.data, initial, keepInHash, shown.tiles);
    document.body.dataset.text = shown.data.text;
  }

  // The request a hash asks: [route, body], or [why it cannot be asked, null]. A comparison
  // reads its texts alone, so a pair and hide special are not sent with one.
  function question(p) {
    const flags = (names) => Object.fromEntries(names.map((k) => [k, p.get(k) === "1"]));
    const measured = p.get("measure") || "weights";
    const number = (k) => (p.get(k) ? +p.get(k) : null);
    const written = p.get("generate") || p.get("target") ? { generate: number("generate"),
      target: p.get("target") || null, sample: p.get("sample") === "1",
      temperature: number("temperature"), seed: number("seed") } : {};
    if (!comparing(p)) {
      return ["/api/page", { text: p.get("text"), pair: p.get("pair") || null, measure: measured,
        ...flags(FLAGS.map(([k]) => k)), ...written }];
    }
    if (p.get("generate") || p.get("target")) return ["a continuation and text B do not combine here: clear one of them (attnviz compare --generate compares two continuations)", null];
    if (p.get("pair")) return ["a sentence pair and text B do not combine: clear one of them", null];
    if (p.get("hide_special") === "1") return ["hide special is not built for comparisons: uncheck it", null];
    return ["/api/compare", { text: p.get("text"), b: p.get("b") || null,
      against_model: p.get("against") === "1", measure: measured, ...flags(["words", "truncate"]) }];
  }

  // What the matrix view asks the server for a region of a head: a tile of the text the
  // server holds. The server holds one text (the last one read): where it holds another now
  // (409), this one is read again for tiles alone (/api/text) and the tile asked once more.
  // The last tiles are kept, so stepping back to a head asks nothing.
  function tilesOf(p, held) {
    let textId = held.text_id;
    const kept = new Map();
    const post = async (route, body) => {
      const response = await fetch(route, { method: "POST",
        headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
      const answer = await response.json();
      if (!response.ok) throw Object.assign(new Error(answer.error || `the server answered ${response.status}`), { status: response.status });
      return answer;
    };
    async function asked(question) {
      const body = { ...question, text_id: textId, packed: true };
      let answer;
      try {
        answer = await post("/api/tile", body);
      } catch (err) {
        if (err.status !== 409) throw err;
        const read = await post("/api/text", { text: p.get("text"), pair: p.get("pair") || null,
          truncate: p.get("truncate") === "1" });
        textId = read.tiles.text_id;
        answer = await post("/api/tile", { ...body, text_id: textId });
      }
      const bytes = Uint8Array.from(atob(answer.values), (c) => c.charCodeAt(0));
      return { ...answer, values: new Float32Array(bytes.buffer) };
    }
    return {
      side: S.limits.tile_side,
      ask(question) {
        const name = JSON.stringify(question);
        if (!kept.has(name)) {
          kept.set(name, asked(question).catch((err) => { kept.delete(name); throw err; }));
          if (kept.size > 32) kept.delete(kept.keys().next().value);
        }
        return kept.get(name);
      },
    };
  }

  // The view's state into the hash, without a history entry (Back goes to the previous text).
  // A comparison's measure is part of its question, and its side (A, B, B − A) of the view.
  function keepInHash(state) {
    const p = params();
    if (!comparing(p)) {
      if (state.measure === "weights") p.delete("measure");
      else p.set("measure", state.measure);
      measure.value = state.measure;
      p.delete("side");
    } else p.set("side", state.stack);
    for (const k of VIEWED.slice(1)) p.set(k, String(state[k]));
    for (const k of ZOOM) {
      if (state.zoom && state.view === "matrix") p.set(k, String(state.zoom[k]));
      else p.delete(k);
    }
    if (state.pool === "mean") p.set("pool", "mean");
    else p.delete("pool");
    history.replaceState(null, "", `#${p}`);
  }

  const seen = new Set();
  function remember(p) {
    const entry = key(p);
    if (seen.has(entry)) return;
    seen.add(entry);
    const q = new URLSearchParams();
    for (const k of ASKED) if (p.get(k)) q.set(k, p.get(k));
    const label = comparing(p)
      ? `${p.get("text")} ⇄ ${p.get("b") || "(A again)"}${p.get("against") === "1" ? ` (B: ${AGAINST.name})` : ""}`
      : p.get("pair") ? `${p.get("text")} | ${p.get("pair")}` : p.get("text");
    texts.prepend(make("li", {}, make("a", { href: `#${q}`, textContent: label, title: label })));
  }

  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const next = `#${fromForm(params())}`;
    if (next === location.hash) load();
    else location.hash = next; // a history entry; hashchange loads it
  });
  window.addEventListener("hashchange", load);
  load();
}
