// attnviz interactive page: reads the JSON in #attnviz-data, draws five views (an
// encoder-decoder model's page: four, for each of its three attention stacks; a compare
// page: five, for text A, text B and B − A over their aligned tokens).
// Everything here runs offline: no request, no remote file, no eval. Weights are [layer][head]
// blobs (deflate + base64) decoded only when a view needs that head.
// `attnviz serve` adds live.js, which asks its server for a text's data and calls draw().
"use strict";

// The class read, after the checkpoint's own where it declares another:
// "ViTForImageClassification read as ViTModel" (ModelInfo.classes in Python).
function classes(model) {
  return model.declared ? `${model.declared} read as ${model.architecture}` : model.architecture;
}

// Draw the page for one text's data D into #app (made, or replaced if there is one):
// `initial` may choose the view, stack, layer, head, query, measure, zoomed region and pooling
// first shown; `onRender` hears the state after each render. `tiles` (attnviz serve's page
// only) asks the server for a region of a head: {side, ask(question) → a promise of the tile}.
// Returns the first render's promise.
function draw(D, initial = {}, onRender = null, tiles = null) {
  // The stacks: an encoder-decoder page has three (encoder and decoder self-attention,
  // cross-attention), each with its own query tokens, key tokens, counts and weights; any
  // other page has one, whose keys are its queries. ST is the stack shown: T queries, S keys;
  // ST.inside its inside-one-head numbers (or ST.inside_note: why they are left out).
  // A compare page (D.compare, C) has three sides in place of stacks: text A, text B, and
  // B − A over their aligned units, which is made here from A's and B's heads.
  const C = D.compare || null;
  const STACKS = C ? { ...D.sides, diff: diffSide() } : D.stacks || { only: { tokens: D.tokens,
    special: D.special, key_tokens: D.tokens, key_special: D.special, causal: D.model.causal,
    layers: D.layers, layer_ids: D.layer_ids, heads: D.heads, encoding: D.encoding,
    weights: D.weights, inside: D.inside, inside_note: D.inside_note } };
  function diffSide() {
    const [a, b] = [D.sides.a, D.sides.b];
    const exact = a.encoding === "float32" && b.encoding === "float32";
    return { tokens: C.labels, special: C.special, key_tokens: C.labels, key_special: C.special,
      causal: a.causal, layers: a.layers, layer_ids: a.layer_ids, heads: a.heads,
      encoding: exact ? "float32" : "uint8", diff: true, inside: null, inside_note: null };
  }
  const STACK_NAMES = {
    encoder: ["Encoder self-attention", "encoder self-attention (source → source)", "source", "source"],
    decoder: ["Decoder self-attention", "decoder self-attention (target → target)", "target", "target"],
    cross: ["Cross-attention", "cross-attention (target → source)", "target", "source"],
    only: ["", "", "", ""],
    a: ["Text A", "A", "", ""],
    b: ["Text B", "B", "", ""],
    diff: ["B − A", "B − A (aligned tokens)", "aligned", "aligned"],
  }; // [title, the switch's option, query side, key side]
  let ST, T, S, L, H;
  let LAYER; // the model layer held in each slot (all layers unless chosen)
  // The measure switch: weights, or a contribution measure (norm per head; alti and rollout
  // one map per layer, so H is 1 while one of them is shown).
  const MEASURES = D.measures || {};
  const perLayer = (m) => !!(MEASURES[m] && MEASURES[m].per_layer);
  const ROW = 18; // px per token in the head view
  // A served text past what the page carries whole has no heads here: its matrix view is
  // drawn from the server's tiles, and the other views are left out (D.tiles_only says why).
  const VIEWS = [
    ["head", "Head view"],
    ["model", "Model view"],
    ["matrix", "Matrix view"],
    ["query", "Query view"],
    ["inside", "Inside one head"],
  ].filter(([v]) => !D.tiles_only || v === "matrix");
  const PAIRS = [
    ["all", "all"],
    ["AB", "A → B"],
    ["BA", "B → A"],
    ["AA", "A → A"],
    ["BB", "B → B"],
  ];
  const firstWord = (special) => Math.max(0, special.indexOf(false));
  const state = {
    view: "head",
    stack: STACKS[initial.stack] ? initial.stack : D.stack || "only",
    layer: 0,
    head: 0,
    heads: null, // the head view's heads shown; null: the layer's most focused one, on opening
    query: 0,
    focus: null, // {side: "q" | "k", index} while hovering or after a click
    locked: false,
    scale: D.scale,
    pair: "all",
    measure: D.measure || "weights",
    zoom: null, // the region of the matrix view shown from tiles: {q0, q1, k0, k1}, half-open
    pool: initial.pool === "mean" ? "mean" : "max", // how a tile longer than its side is pooled
  };
  setStack(state.stack);
  // Switch to another stack: its counts, every head shown, the layer, head and query kept
  // where they exist (the query only while the queries are the same tokens: decoder, cross).
  function setStack(name) {
    const next = STACKS[name];
    const same = ST && ST.tokens.join("\u0000") === next.tokens.join("\u0000");
    const carried = C && ST ? carry(state.stack, name, state.query) : -1;
    state.stack = name;
    ST = next;
    [T, S, L, LAYER] = [ST.tokens.length, ST.key_tokens.length, ST.layers, ST.layer_ids];
    H = perLayer(state.measure) ? 1 : ST.heads;
    if (state.heads && [...state.heads].some((h) => h >= H)) state.heads = null; // kept where it can be
    state.layer = Math.min(state.layer, L - 1);
    state.head = Math.min(state.head, H - 1);
    state.query = same ? Math.min(state.query, T - 1) : carried >= 0 ? carried : firstWord(ST.special);
  }
  // A compare page's query, from one side to another through the aligned units: a token of A
  // or B to its unit, a unit to its first token; -1 for a token with no partner.
  function carry(from, to, i) {
    const unitsOf = (side) => (side === "a" ? C.units_a : C.units_b);
    const unit = from === "diff" ? i : unitsOf(from).findIndex((tokens) => tokens.includes(i));
    if (unit < 0) return -1;
    return to === "diff" ? unit : unitsOf(to)[unit][0];
  }
  if (initial.measure && (initial.measure === "weights" || MEASURES[initial.measure])) {
    setMeasure(initial.measure);
  }
  for (const [key, count] of [["layer", L], ["head", H], ["query", T]]) {
    if (Number.isInteger(initial[key]) && initial[key] >= 0 && initial[key] < count) state[key] = initial[key];
  }
  if (Number.isInteger(initial.head) && state.head === initial.head) state.heads = new Set([state.head]);
  if (initial.zoom) {
    const { q0, q1, k0, k1 } = initial.zoom;
    const within = (a, b, n) => Number.isInteger(a) && Number.isInteger(b) && a >= 0 && a < b && b <= n;
    if (within(q0, q1, T) && within(k0, k1, S)) state.zoom = { q0, q1, k0, k1 };
  }
  function setMeasure(m) {
    state.measure = m;
    H = perLayer(m) ? 1 : ST.heads;
    state.heads = null;
    state.head = Math.min(state.head, H - 1);
  }
  // 1 on the absolute colour scale: 1 for weights and rows that sum to 1, the text's largest
  // value for norm (a length).
  // On a compare page: 1 for weights, a norm's largest value, and B − A's largest |B − A|.
  const top = () => (ST.diff ? C.diff_top : C ? C.top
    : state.measure === "weights" ? 1 : MEASURES[state.measure].top);
  const headName = (h) => (perLayer(state.measure) ? "all heads" : `H${h}`);
  const valueName = () => (ST.diff ? "B − A" : C ? (C.measure === "weights" ? "weight" : C.measure)
    : state.measure === "weights" ? "weight" : state.measure);
  const unitName = () => (C ? C.unit : state.measure === "weights" ? "attention weight"
    : MEASURES[state.measure].unit);
  // How a view names its axes: "source tokens" on an encoder-decoder page, else "tokens".
  const sideName = (n) => STACK_NAMES[state.stack][2 + n];
  const tokensOf = (n) => (sideName(n) ? `${sideName(n)} tokens` : "tokens");
  const axes = () => (D.stacks ? `${tokensOf(0)} (queries) down, ${tokensOf(1)} (keys) across`
    : "query tokens down, key tokens across");
  const layerTitle = (l) => (D.stacks ? `${STACK_NAMES[state.stack][0]}, layer ${l}` : `Layer ${l}`);

  // ---------- decoding ----------
  const bytesOf = (b64) => Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  async function inflate(b64) {
    const stream = new Blob([bytesOf(b64)]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }
  const floats = (bytes) => new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);

  const heads = new Map();
  const stepOf = new Map(); // "stack/measure/layer/head" -> its max, when stored as uint8 steps of it
  // One blob as a Float32Array (T × S): float32 as it is, or uint8 steps of its max.
  function decode(key, blob, encoding) {
    return inflate(blob).then((bytes) => {
      if (encoding === "float32") return floats(bytes.slice());
      const max = floats(bytes.slice(0, 4))[0];
      stepOf.set(key, max);
      const out = new Float32Array(bytes.length - 4);
      for (let n = 0; n < out.length; n++) out[n] = (bytes[4 + n] * max) / 255;
      return out;
    });
  }
  // One head of the shown stack and measure as a Float32Array (T × S), row-major [query, key];
  // decoded once. Norm is α_ij ‖f(x_j)‖: the weights times each key's length, where given.
  function head(l, h, m = state.measure) {
    const key = `${state.stack}/${m}/${l}/${h}`;
    if (!heads.has(key)) {
      let made;
      if (ST.diff) made = aligned(l, h).then((g) => g.diff);
      else if (m === "weights") made = decode(key, ST.weights[l][h], ST.encoding);
      else if (MEASURES[m].lengths) {
        const keys = S;
        made = Promise.all([head(l, h, "weights"), inflate(MEASURES[m].lengths[l][h])]).then(([a, b]) => {
          const lengths = floats(b.slice());
          const out = new Float32Array(a.length);
          for (let n = 0; n < a.length; n++) out[n] = a[n] * lengths[n % keys];
          return out;
        });
      } else made = decode(key, MEASURES[m].blobs[l][h], MEASURES[m].encoding);
      heads.set(key, made);
    }
    return heads.get(key);
  }
  // The largest value of a head; of B − A, the largest |B − A|.
  const headMax = (a) => a.reduce((m, x) => Math.max(m, ST.diff ? Math.abs(x) : x), 0);

  // ---------- a compare page: A and B over their aligned units ----------
  // A side's head (n × n) read over the aligned units (U × U) as analysis/compare.py's
  // `project` reads it: a unit's row is the mean of its tokens' rows and its column the sum of
  // its tokens' columns, then each row is renormalised over the aligned keys (the mean's
  // 1/count cancels there; a row with no weight on them stays 0).
  function project(a, n, units) {
    const U = units.length;
    const unitOf = new Int32Array(n).fill(-1);
    units.forEach((tokens, u) => tokens.forEach((t) => { unitOf[t] = u; }));
    const out = new Float64Array(U * U);
    units.forEach((tokens, u) => {
      for (const i of tokens) {
        for (let j = 0; j < n; j++) if (unitOf[j] >= 0) out[u * U + unitOf[j]] += a[i * n + j];
      }
      let mass = 0;
      for (let k = 0; k < U; k++) mass += out[u * U + k];
      if (mass > 0) for (let k = 0; k < U; k++) out[u * U + k] /= mass;
    });
    return out;
  }
  // Layer slot l, head h of A and of B over the aligned units, and B − A: made once.
  const alignedHeads = new Map();
  function aligned(l, h) {
    const key = `${l}/${h}`;
    if (!alignedHeads.has(key)) {
      const side = (name) => {
        const s = STACKS[name];
        const k = `${name}/weights/${l}/${h}`; // the key head() gives it on that side
        if (!heads.has(k)) heads.set(k, decode(k, s.weights[l][h], s.encoding));
        return heads.get(k).then((a) => project(a, s.tokens.length, name === "a" ? C.units_a : C.units_b));
      };
      alignedHeads.set(key, Promise.all([side("a"), side("b")])
        .then(([a, b]) => ({ a, b, diff: b.map((x, n) => x - a[n]) })));
    }
    return alignedHeads.get(key);
  }
  // Each aligned query's JS divergence (L × H × U, nats; NaN where it has none), as compare
  // computed it, and each head's: the Python numbers.
  const rowsMoved = C ? inflate(C.rows).then((b) => floats(b.slice())) : null;
  const moved = (l, h) => C.divergence[l][h];
  const nats = (x) => (Number.isFinite(x) ? x.toFixed(4) : "–");

  // A weight as text: exact float32 digits, or the quantised value with its error bound.
  function weightText(w, l, h) {
    if (ST.diff) return `${ST.encoding === "float32" ? "" : "≈"}${w > 0 ? "+" : ""}${ST.encoding === "float32" ? w.toPrecision(6) : w.toFixed(4)}`;
    const m = state.measure;
    const stored = m === "weights" || MEASURES[m].lengths ? ST.encoding : MEASURES[m].encoding;
    if (stored === "float32") return w.toPrecision(6);
    const step = stepOf.get(`${state.stack}/${m}/${l}/${h}`);
    if (step === undefined) return `≈${w.toFixed(4)}`; // norm from 8-bit weights
    return `≈${w.toFixed(4)} (±${(step / 510).toExponential(1)})`;
  }

  // ---------- colours ----------
  const LUT = new Uint8Array(256 * 3);
  for (let n = 0; n < 256 * 3; n++) LUT[n] = parseInt(D.colours.substr(2 * n, 2), 16);
  // B − A's diverging map (a compare page): blue (more in A) through white (0) to red (more in B).
  const DLUT = new Uint8Array(256 * 3);
  if (C) for (let n = 0; n < 256 * 3; n++) DLUT[n] = parseInt(C.diverging.substr(2 * n, 2), 16);
  const lutColour = (lut, n) => [lut[3 * n], lut[3 * n + 1], lut[3 * n + 2]];
  // A value's colour: the colour map from 0 to `max`, or (signed) the diverging map from −max
  // to +max, 0 in its middle.
  const colourOf = (v, max, signed) => (signed
    ? lutColour(DLUT, Math.max(0, Math.min(255, Math.round((v / max + 1) * 127.5))))
    : lutColour(LUT, Math.max(0, Math.min(255, Math.round((v / max) * 255)))));
  const MORE_IN_B = () => `rgb(${lutColour(DLUT, 235).join(",")})`;
  const MORE_IN_A = () => `rgb(${lutColour(DLUT, 20).join(",")})`;
  const headColour = (h) => `hsl(${Math.round((360 * h) / H)}, 75%, 45%)`;
  const rgbOf = (hex) => [1, 3, 5].map((n) => parseInt(hex.substr(n, 2), 16));
  const MASKED = rgbOf(D.masked.grey);
  const HATCH = rgbOf(D.masked.hatch);
  const OUTSIDE = [235, 235, 235]; // cells outside the chosen sentences of a pair
  // A causal model's key after its query: the grey with a "/" line every 6 px, as in the PNGs.
  const masked = (i, j) => ST.causal && j > i;
  function setPixel(data, p, rgb) {
    data[p] = rgb[0];
    data[p + 1] = rgb[1];
    data[p + 2] = rgb[2];
    data[p + 3] = 255;
  }
  const maskedAt = (x, y) => ((x + y) % 6 === 0 ? HATCH : MASKED);
  // Heads the pass removed (show --ablate) have no pattern: every view marks them instead,
  // white with light grey cross-hatching and "removed", as in the PNGs; no heatmap, no lines.
  const REMOVED = new Set(((D.removed && D.removed.heads) || []).map(([l, h]) => `${l}/${h}`));
  const REMOVED_HATCH = rgbOf((D.removed && D.removed.hatch) || "#c8c8c8");
  const isRemoved = (l, h) => !perLayer(state.measure) && REMOVED.has(`${LAYER[l]}/${h}`);
  const removedAt = (x, y) => ((x + y) % 6 === 0 || (((x - y) % 6) + 6) % 6 === 0 ? REMOVED_HATCH : [255, 255, 255]);
  // A removed head's panel: the hatching, and `lines` of text on white in the middle.
  function paintRemoved(canvas, width, height, lines) {
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(width, height);
    for (let y = 0; y < height; y++) {
      for (let x = 0; x < width; x++) setPixel(img.data, 4 * (y * width + x), removedAt(x, y));
    }
    ctx.putImageData(img, 0, 0);
    const size = Math.max(9, Math.min(16, Math.floor(width / 12)));
    ctx.font = `${size}px ${getComputedStyle(document.body).fontFamily}`;
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    lines.forEach((text, n) => {
      const y = height / 2 + (n - (lines.length - 1) / 2) * size * 1.4;
      const w = ctx.measureText(text).width;
      ctx.fillStyle = "#fff";
      ctx.fillRect(width / 2 - w / 2 - 3, y - size * 0.7, w + 6, size * 1.4);
      ctx.fillStyle = "#1d2330";
      ctx.fillText(text, width / 2, y);
    });
    canvas.dataset.removed = "1";
  }

  function allowed(i, j) {
    if (!D.segments || state.pair === "all") return true;
    const want = { A: 0, B: 1 };
    return D.segments[i] === want[state.pair[0]] && D.segments[j] === want[state.pair[1]];
  }

  // ---------- DOM helpers ----------
  function el(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props)) {
      if (k === "dataset") Object.assign(node.dataset, v);
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else if (k === "className" || k === "textContent" || k === "title" || k === "value")
        node[k] = v;
      else node.setAttribute(k, v);
    }
    node.append(...children);
    return node;
  }
  function select(label, id, options, current, onChange) {
    const s = el("select", { id, onchange: (e) => onChange(e.target.value) });
    for (const [value, text] of options) {
      s.append(el("option", { value: String(value), textContent: text }));
    }
    s.value = String(current);
    return el("label", { className: "control" }, label + " ", s);
  }
  const tokenLabel = (i) => `${i}: ${ST.tokens[i]}`; // a query
  const keyLabel = (j) => `${j}: ${ST.key_tokens[j]}`;
  // One line of `text`, cut at a word boundary to at most `length` characters (with "…").
  function shortened(text, length) {
    const flat = text.split(/\s+/).filter(Boolean).join(" ");
    if (flat.length <= length) return flat;
    let cut = flat.slice(0, length - 1);
    if (cut.lastIndexOf(" ") > length / 2) cut = cut.slice(0, cut.lastIndexOf(" "));
    return cut.replace(/[ ,;:.]+$/, "") + "…";
  }

  // ---------- page frame ----------
  const app = el("div", { id: "app" });
  const previous = document.getElementById("app");
  if (previous) previous.replaceWith(app);
  else document.body.append(app);
  const facts = D.stacks ? stackFacts() : C ? compareFacts()
    : `${D.model.name} · ${classes(D.model)} · ${L} layers × ${D.heads} heads · ${T} ${D.unit}s`;
  // A compare page: the model(s), the counts of both texts and of their aligned units.
  function compareFacts() {
    const [ma, mb] = C.models;
    const who = ma === mb ? ma : `A: ${ma} · B: ${mb}`;
    const [ta, tb] = [D.sides.a.tokens.length, D.sides.b.tokens.length];
    return `${who} · ${classes(D.model)} · ${L} layers × ${D.sides.a.heads} heads · ` +
      `A ${ta} ${D.unit}s, B ${tb} ${D.unit}s, ${C.labels.length} aligned` +
      (C.pair ? ` · pair ${C.pair[0]} of ${C.pair[1]}` : "") +
      (C.measure === "weights" ? "" : ` · compared by ${C.measure}`);
  }
  // The heads that moved most, as the terminal lists them.
  function movedLine() {
    const all = C.divergence.flatMap((row, l) => row.map((d, h) => [d, l, h]));
    const most = all.sort((x, y) => y[0] - x[0]).slice(0, 3)
      .map(([d, l, h]) => `L${LAYER[l]} H${h} ${d.toFixed(4)}`).join(", ");
    const mean = all.reduce((t, [d]) => t + d, 0) / all.length;
    return `How far each head moved from A to B (JS divergence, nats; mean over the aligned ` +
      `queries): most ${most}; mean over the heads ${mean.toFixed(4)}. “Text” switches every view between ` +
      "A, B and B − A.";
  }
  // An encoder-decoder model: its stacks' counts, and the source's and target's lengths.
  function stackFacts() {
    const [[, le, he], [, ld, hd]] = D.model.stacks;
    const [source, target] = [D.stacks.encoder.tokens.length, D.stacks.decoder.tokens.length];
    return `${D.model.name} · ${classes(D.model)} · encoder ${le} layers × ${he} heads, ` +
      `decoder ${ld} layers × ${hd} heads (self- and cross-attention) · ` +
      `${source} source ${D.unit}s, ${target} target ${D.unit}s (the decoder's start token first)`;
  }
  // A long text shows its first lines and a button for the rest: nothing is ever cut off.
  function textLine(which, text) {
    const p = el("p", { className: "text" });
    if (which) p.append(el("span", { className: "which", textContent: which }), " ");
    const short = shortened(text, 240);
    const body = el("span", { className: "body", textContent: short });
    p.append(body);
    if (short !== text.trim()) {
      const more = el("button", { className: "more", type: "button" });
      const label = () => { more.textContent = body.textContent === short ? `whole text (${text.length} characters)` : "shorter"; };
      more.addEventListener("click", () => { body.textContent = body.textContent === short ? text : short; label(); });
      label();
      p.append(" ", more);
    }
    return p;
  }
  // A decoder's continuation (--generate, --target): its tokens are marked, and the query
  // view steps through them, each from the row that wrote it.
  const W = !C && !D.stacks ? D.continuation || null : null;
  const written = (i) => !!W && i >= W.start;
  function continuedText() {
    const line = textLine("prompt", D.text.slice(0, W.text_at));
    const tail = textLine(W.generated ? "written" : "given", D.text.slice(W.text_at));
    tail.classList.add("written");
    return [line, tail, el("p", { className: "facts", textContent: W.line })];
  }
  app.append(
    el("header", {},
      el("h1", { textContent: "attnviz" }),
      ...(D.stacks ? [textLine("source", D.text), textLine("target", D.target)]
        : C ? [textLine("A", D.text), textLine("B", C.text_b)]
          : W ? continuedText()
            : D.pair === null ? [textLine("", D.text)] : [textLine("A", D.text), textLine("B", D.pair)]),
      el("p", { className: "facts", textContent: facts }),
      C ? el("p", { className: "facts moved", textContent: movedLine() }) : "",
      C && C.note ? el("p", { className: "note", id: "unaligned", textContent: C.note }) : "",
      ...D.notes.map((n) => el("p", { className: "note", textContent: n })),
      D.stacks ? el("p", { className: "note", textContent: D.measures_note }) : "",
      ST.encoding === "float32" ? "" : el("p", { className: "note", textContent:
        "weights are stored as 8-bit steps of each head's maximum (error ≤ max/510); " +
        "numbers are shown with that bound" }),
    ),
  );
  const tabs = el("nav", { role: "tablist" });
  for (const [name, title] of VIEWS) {
    tabs.append(el("button", { role: "tab", id: `tab-${name}`, textContent: title,
      onclick: () => show(name) }));
  }
  const controls = el("div", { className: "controls", id: "controls" });
  const main = el("main");
  app.append(tabs, controls, main);
  const tooltip = el("div", { id: "tooltip", role: "status" });
  document.getElementById("tooltip")?.remove();
  document.body.append(tooltip);

  function drawControls() {
    controls.replaceChildren();
    const v = state.view;
    if (D.stacks) {
      const names = Object.keys(D.stacks).map((s) => [s, STACK_NAMES[s][1]]);
      controls.append(select("Stack", "stack", names, state.stack, (x) => { setStack(x); render(); }));
    }
    if (C) {
      const names = Object.keys(STACKS).map((s) => [s, STACK_NAMES[s][1]]);
      controls.append(select("Text", "side", names, state.stack, (x) => { setStack(x); render(); }));
    }
    if (v !== "model" && v !== "query") {
      controls.append(select("Layer", "layer", [...Array(L).keys()].map((l) => [l, `${LAYER[l]}`]),
        state.layer, (x) => { state.layer = +x; render(); }));
    }
    if ((v === "matrix" && !perLayer(state.measure)) || v === "inside") {
      const count = v === "inside" ? (ST.inside && ST.inside.heads) || ST.heads : H;
      controls.append(select("Head", "head", [...Array(count).keys()].map((h) => [h, `${h}`]),
        state.head, (x) => { state.head = +x; render(); }));
    }
    if (v === "query" || v === "inside") {
      const tokens = v === "inside" && ST.inside ? ST.inside.tokens : ST.tokens;
      const opts = tokens.map((t, i) => [i, `${i}: ${t}${written(i) ? " ▸" : ""}`]);
      controls.append(select("Query", "query", opts, Math.min(state.query, tokens.length - 1),
        (x) => { state.query = +x; render(); }));
    }
    if (v !== "inside" && Object.keys(MEASURES).length) {
      const names = ["weights", ...Object.keys(MEASURES)];
      controls.append(select("Measure", "measure", names.map((m) => [m, m]), state.measure,
        (x) => { setMeasure(x); render(); }));
    }
    if (v !== "inside") {
      const upper = top();
      controls.append(select("Colour scale", "scale",
        [["absolute", upper === null ? "absolute (not known for this text: each tile's max)"
          : ST.diff ? `absolute (±${+upper.toPrecision(3)})` : `absolute (0–${+upper.toPrecision(3)})`],
        ["head", "each head to its max"]], state.scale,
        (x) => { state.scale = x; render(); }));
    }
    if (v === "matrix" && zoomable() && (state.zoom || D.tiles_only)) {
      const z = state.zoom || WHOLE();
      if (z.q1 - z.q0 > tiles.side || z.k1 - z.k0 > tiles.side) {
        controls.append(select("Pool", "pool", [["max", "max of each block"], ["mean", "mean of each block"]],
          state.pool, (x) => { state.pool = x; render(); }));
      }
    }
    if (D.segments && v !== "inside") {
      controls.append(select("Sentences", "pair", PAIRS, state.pair,
        (x) => { state.pair = x; render(); }));
    }
  }

  function show(name) {
    state.view = name;
    state.focus = null;
    state.locked = false;
    for (const [v] of VIEWS) {
      document.getElementById(`tab-${v}`).setAttribute("aria-selected", String(v === name));
    }
    render();
  }

  let rendering = Promise.resolve();
  function render() {
    drawControls();
    tooltip.hidden = true;
    const view = { head: headView, model: modelView, matrix: matrixView, query: queryView,
      inside: insideView }[state.view];
    rendering = rendering.then(async () => {
      const section = el("section", { id: `view-${state.view}` });
      await view(section);
      main.replaceChildren(section);
      document.body.dataset.view = state.view;
      document.body.dataset.renders = String(+(document.body.dataset.renders || 0) + 1);
      if (onRender) onRender(state);
    }).catch((err) => {
      main.replaceChildren(el("p", { className: "error", textContent: String(err) }));
      throw err;
    });
    return rendering;
  }

  // ---------- head view ----------
  // The layer's most focused head (the largest mean over its query rows of the row's largest
  // weight, removed heads left out): what the head view opens on, the others a click away.
  async function focused(l) {
    let best = -1, bestScore = -Infinity;
    for (let h = 0; h < H; h++) {
      if (isRemoved(l, h)) continue;
      const a = await head(l, h);
      let sum = 0;
      for (let i = 0; i < T; i++) {
        let top = 0;
        for (let j = 0; j < S; j++) top = Math.max(top, a[i * S + j]);
        sum += top;
      }
      if (sum / T > bestScore) [best, bestScore] = [h, sum / T];
    }
    return Math.max(best, 0);
  }
  // What the shown measure is, said above every view but the weights'.
  function measureNote() {
    if (state.measure === "weights") return "";
    const m = MEASURES[state.measure];
    return el("p", { className: "hint measure", textContent:
      `${state.measure}: ${m.help} (${m.cite}).` });
  }

  async function headView(section) {
    if (perLayer(state.measure)) {
      section.append(measureNote(), el("p", { className: "note", textContent:
        `${state.measure} has one map per layer, not per head: see the model, matrix and query views.` }));
      return;
    }
    if (state.heads === null) state.heads = new Set([await focused(state.layer)]);
    const toggles = el("div", { className: "toggles" });
    for (let h = 0; h < H; h++) {
      const gone = isRemoved(state.layer, h);
      const b = el("button", {
        className: "head-toggle" + (gone ? " removed" : ""),
        textContent: ST.diff ? `${h} · ${nats(moved(state.layer, h))}` : `${h}`,
        title: gone ? `head ${h}: ${D.removed.note}` : ST.diff
          ? `head ${h}: JS divergence ${nats(moved(state.layer, h))} nats (double-click: only it)`
          : `head ${h} (double-click: only it)`,
        "aria-pressed": String(!gone && state.heads.has(h)), dataset: { head: String(h) },
        onclick: () => { state.heads.has(h) ? state.heads.delete(h) : state.heads.add(h); render(); },
        ondblclick: () => { state.heads = new Set([h]); render(); },
      });
      b.style.setProperty("--head", headColour(h));
      toggles.append(b);
    }
    toggles.append(
      el("button", { textContent: "all", onclick: () => { state.heads = new Set([...Array(H).keys()]); render(); } }),
      el("button", { textContent: "none", onclick: () => { state.heads.clear(); render(); } }),
    );
    const width = 260;
    // The canvas is only as tall as the window and stays in view (sticky): on long texts it
    // redraws the lines crossing the visible band as the page scrolls, never 9000 px of them.
    const canvas = el("canvas", { id: "lines", width });
    const column = (side) => {
      const col = el("div", { className: `tokens ${side}` });
      const [tokens, special] = side === "q" ? [ST.tokens, ST.special] : [ST.key_tokens, ST.key_special];
      tokens.forEach((t, i) => {
        const span = el("div", { className: "token" + (special[i] ? " special" : "") + (written(i) ? " written" : ""),
          textContent: t, dataset: { side, index: String(i) } });
        span.addEventListener("mouseenter", () => { if (!state.locked) focus({ side, index: i }); });
        span.addEventListener("mouseleave", () => { if (!state.locked) focus(null); });
        span.addEventListener("click", () => {
          const same = state.locked && state.focus && state.focus.side === side && state.focus.index === i;
          state.locked = !same;
          focus(same ? null : { side, index: i });
        });
        col.append(span);
      });
      return col;
    };
    const left = column("q");
    const right = column("k");
    const drawn = [...state.heads].filter((h) => !isRemoved(state.layer, h)); // no lines for a removed head
    const grids = await Promise.all(drawn.map((h) => head(state.layer, h).then((a) => [h, a])));
    const gone = [...Array(H).keys()].filter((h) => isRemoved(state.layer, h));
    // An encoder-decoder page names the two columns (cross-attention's differ).
    const sides = D.stacks ? [0, el("span"), 1].map((n) => (typeof n === "number"
      ? el("div", { className: `side ${n ? "k" : "q"}`, textContent: `${sideName(n)} (${n ? "keys" : "queries"})` }) : n)) : [];
    const columns = el("div", { className: "columns" + (D.stacks ? " named" : "") }, ...sides, left, canvas, right);
    let lines = [];
    const draw = () => paintLines(canvas, lines, left);
    const focus = (f) => {
      state.focus = f;
      for (const node of section.querySelectorAll(".token")) {
        node.classList.toggle("focus", !!f && node.dataset.side === f.side && +node.dataset.index === f.index);
      }
      lines = visibleLines(grids, f);
      canvas.dataset.lines = String(lines.reduce((n, [, , pairs]) => n + pairs.length / 2, 0));
      draw();
    };
    section.append(
      el("p", { className: "hint", textContent: ST.diff
        ? `${layerTitle(LAYER[state.layer])}, B − A: a line from each aligned token (left) to each aligned token ` +
          "(right) whose weight changed from A to B (rows renormalised over the aligned keys), red where B " +
          "gives it more, blue where A does, opacity = |B − A|; each head's button gives its JS divergence " +
          "(nats). Hover or click a token to see only its lines; ↑/↓ change the layer."
        : `${layerTitle(LAYER[state.layer])}. Lines from each ${tokensOf(0).replace(/s$/, "")} (left) to the ${tokensOf(1)} it attends to (right), ` +
        (state.measure === "weights" ? "" : `by ${state.measure}, `) +
        "one colour per head, opacity = weight. Hover or click a token to see only its lines; " +
        "↑/↓ change the layer." }),
      measureNote(),
      gone.length ? el("p", { className: "note removed", textContent:
        `${gone.map((h) => `H${h}`).join(", ")}: ${D.removed.note}; no lines are drawn for it.` }) : "",
      toggles,
      columns,
    );
    onScroll = () => requestAnimationFrame(draw);
    focus(state.focus);
  }
  let onScroll = null;
  // Assigned, not added: a page drawn again (live.js) replaces the previous page's handlers.
  window.onscroll = window.onresize = () => { if (state.view === "head" && onScroll) onScroll(); };

  // The lines that carry visible weight, as [head, opacity step, [query, key, …], sign]
  // (B − A: 1 where B gives more, -1 where A does; opacity is |B − A|).
  function visibleLines(grids, f) {
    const out = [];
    for (const [h, a] of grids) {
      const max = state.scale === "head" ? headMax(a) || 1 : top();
      const buckets = Array.from({ length: 32 }, () => []); // 16 opacity steps of each sign
      const [i0, i1] = f && f.side === "q" ? [f.index, f.index + 1] : [0, T];
      for (let i = i0; i < i1; i++) {
        for (let j = 0; j < S; j++) {
          if (f && f.side === "k" && j !== f.index) continue;
          const x = a[i * S + j] / max;
          const v = ST.diff ? Math.abs(x) : x; // opacity is the weight, as in BertViz
          if (v < 1 / 64 || !allowed(i, j)) continue;
          buckets[Math.min(15, Math.floor(v * 16)) + (x < 0 ? 16 : 0)].push(i, j);
        }
      }
      buckets.forEach((pairs, b) => { if (pairs.length) out.push([h, b % 16, pairs, b < 16 ? 1 : -1]); });
    }
    return out;
  }

  // Draw the lines that cross the part of the token columns now on screen (`column`: the
  // query tokens' column, whose top is the first token's).
  function paintLines(canvas, lines, column) {
    const rows = Math.max(T, S);
    const height = Math.min(rows * ROW, window.innerHeight);
    if (canvas.height !== height) canvas.height = height;
    const top = Math.max(0, Math.min(rows * ROW - height, -column.getBoundingClientRect().top));
    canvas.style.marginTop = `${top}px`;
    const ctx = canvas.getContext("2d");
    const w = canvas.width;
    ctx.clearRect(0, 0, w, height);
    ctx.lineWidth = 1.6;
    let painted = 0;
    for (const [h, b, pairs, sign] of lines) {
      ctx.strokeStyle = ST.diff ? (sign > 0 ? MORE_IN_B() : MORE_IN_A()) : headColour(h);
      ctx.globalAlpha = (b + 1) / 16;
      ctx.beginPath();
      for (let n = 0; n < pairs.length; n += 2) {
        const y0 = pairs[n] * ROW + ROW / 2 - top;
        const y1 = pairs[n + 1] * ROW + ROW / 2 - top;
        if ((y0 < 0 && y1 < 0) || (y0 > height && y1 > height)) continue;
        ctx.moveTo(2, y0);
        ctx.lineTo(w - 2, y1);
        painted++;
      }
      ctx.stroke();
    }
    ctx.globalAlpha = 1;
    canvas.dataset.painted = String(painted);
  }

  // ---------- colour legend ----------
  // The colour map from 0 to `top`, then the greys that are not weights: the masked cells of a
  // causal model, and the cells outside the chosen sentences of a pair.
  function legend(upper) {
    const swatch = (colourAt) => {
      const c = el("canvas", { className: "swatch", width: 14, height: 14 });
      const ctx = c.getContext("2d");
      const img = ctx.createImageData(14, 14);
      for (let y = 0; y < 14; y++) for (let x = 0; x < 14; x++) setPixel(img.data, 4 * (y * 14 + x), colourAt(x, y));
      ctx.putImageData(img, 0, 0);
      return c;
    };
    const bar = el("canvas", { className: "legend-bar", width: 256, height: 14 });
    const ctx = bar.getContext("2d");
    const img = ctx.createImageData(256, 14);
    const lut = ST.diff ? DLUT : LUT;
    const numeric = /^[\d.]/.test(upper);
    for (let y = 0; y < 14; y++) {
      for (let x = 0; x < 256; x++) setPixel(img.data, 4 * (y * 256 + x), lutColour(lut, x));
    }
    ctx.putImageData(img, 0, 0);
    const box = el("div", { className: "legend" },
      el("span", { textContent: ST.diff ? `B − A: −${numeric ? upper : "max"}` : `${unitName()}: 0` }),
      bar, el("span", { textContent: ST.diff ? `+${numeric ? upper : `max (${upper})`}` : upper }));
    if (ST.diff) box.append(el("span", { className: "key diverging", textContent: C.legend }));
    if (ST.causal) {
      box.append(el("span", { className: "key masked" }, swatch(maskedAt), ` ${D.masked.note}`));
    }
    if (D.segments && state.pair !== "all") {
      box.append(el("span", { className: "key outside" }, swatch(() => OUTSIDE), " outside the chosen sentences"));
    }
    if (REMOVED.size && !perLayer(state.measure)) {
      box.append(el("span", { className: "key removed" }, swatch(removedAt), ` ${D.removed.note}`));
    }
    return box;
  }

  // ---------- model view ----------
  async function modelView(section) {
    const size = 76;
    // A non-square stack (cross-attention) keeps its shape: the longer side is `size` px.
    const [w, h0] = [S, T].map((n) => Math.round((size * n) / Math.max(T, S)));
    const grid = el("div", { className: "model-grid" });
    grid.style.gridTemplateColumns = `3em repeat(${H}, ${size}px)`;
    grid.append(el("span"));
    for (let h = 0; h < H; h++) grid.append(el("span", { className: "axis", textContent: headName(h) }));
    const all = await Promise.all(
      [...Array(L * H).keys()].map((n) => head(Math.floor(n / H), n % H)),
    );
    for (let l = 0; l < L; l++) {
      grid.append(el("span", { className: "axis", textContent: `L${LAYER[l]}` }));
      for (let h = 0; h < H; h++) {
        const gone = isRemoved(l, h);
        const c = el("canvas", { width: w, height: h0, className: "thumb",
          title: `layer ${LAYER[l]} ${perLayer(state.measure) ? state.measure : `head ${h}`}` +
            (gone ? `: ${D.removed.note}` : ": click to open the matrix"),
          dataset: { layer: String(LAYER[l]), head: String(h) },
          onclick: () => { state.layer = l; state.head = h; show("matrix"); } });
        if (gone) paintRemoved(c, w, h0, ["removed"]);
        else paint(c, all[l * H + h], w, h0);
        if (ST.diff) { // under each head, how far it moved
          c.title = `layer ${LAYER[l]} head ${h}: JS divergence ${nats(moved(l, h))} nats; click to open the matrix`;
          grid.append(el("div", { className: "thumb-cell" }, c,
            el("span", { className: "moved", textContent: nats(moved(l, h)) })));
        } else grid.append(c);
      }
    }
    section.append(
      el("p", { className: "hint", textContent: ST.diff
        ? `B − A in every layer × head, over the aligned tokens (${axes()}); under each, its JS divergence ` +
          "(nats; mean over the aligned queries). Click one to open it."
        : `${D.stacks ? `${STACK_NAMES[state.stack][0]}, every` : "Every"} layer × head: ${axes()}. Click one to open it.` }),
      measureNote(),
      legend(state.scale === "head" ? "each head's max" : `${+top().toPrecision(3)}`),
      grid,
    );
  }

  // Paint a head (T × S) into `canvas`, `width` × `height` px: max-pooling keeps thin lines
  // when there are more tokens than pixels. A pixel none of whose cells can be seen is masked
  // (a causal model) or outside the pair.
  // B − A (`signed`) keeps the value of largest magnitude and takes the diverging map; `max`
  // is 1 on the colour scale.
  function paint(canvas, a, width, height, signed = !!ST.diff,
    max = state.scale === "head" ? headMax(a) || 1 : top()) {
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(width, height);
    for (let y = 0; y < height; y++) {
      const i0 = Math.floor((y * T) / height);
      const i1 = Math.max(i0 + 1, Math.floor(((y + 1) * T) / height));
      for (let x = 0; x < width; x++) {
        const j0 = Math.floor((x * S) / width);
        const j1 = Math.max(j0 + 1, Math.floor(((x + 1) * S) / width));
        let v = 0;
        let shown = false;
        for (let i = i0; i < i1; i++) {
          for (let j = j0; j < j1; j++) {
            if (!allowed(i, j) || masked(i, j)) continue;
            shown = true;
            const x = a[i * S + j];
            if (signed ? Math.abs(x) > Math.abs(v) : x > v) v = x;
          }
        }
        const p = 4 * (y * width + x);
        if (shown) setPixel(img.data, p, colourOf(v, max, signed));
        else setPixel(img.data, p, ST.causal ? maskedAt(x, y) : OUTSIDE);
      }
    }
    ctx.putImageData(img, 0, 0);
  }

  // ---------- matrix view ----------
  const shortLabel = (t) => (t.length <= 16 ? t : t.slice(0, 15) + "…");
  const textWidth = (() => {
    const ctx = document.createElement("canvas").getContext("2d");
    return (text, px) => {
      ctx.font = `${px}px ${getComputedStyle(document.body).fontFamily}`;
      return ctx.measureText(text).width;
    };
  })();

  // A removed head's matrix: the hatched panel where its heatmap would be, and why.
  function removedMatrix(section) {
    const size = Math.min(720, Math.max(480, Math.max(T, S) * 24));
    const panel = el("canvas", { id: "matrix", width: size, height: size });
    paintRemoved(panel, size, size, ["removed (--ablate)", "its output was set to 0:", "no pattern"]);
    const frame = el("div", { className: "matrix-frame" }, panel);
    frame.style.width = frame.style.height = `${size}px`;
    section.append(
      el("p", { className: "hint", textContent: `${layerTitle(LAYER[state.layer])}, head ${state.head}: ` +
        `${D.removed.note}; its weights are not drawn as a pattern. ↑/↓ layer, ←/→ head.` }),
      frame,
    );
  }

  async function matrixView(section) {
    if (isRemoved(state.layer, state.head)) return removedMatrix(section);
    if (zoomable() && (state.zoom || D.tiles_only)) return tileView(section);
    const a = await head(state.layer, state.head);
    const g = ST.diff ? await aligned(state.layer, state.head) : null; // A's and B's too
    // The longer side 480–720 px, 24 px a token while that fits. An encoder-decoder page keeps
    // whole pixels per token: the cells of a non-square stack are squares of one size.
    const longer = Math.max(T, S);
    const fit = Math.min(720, Math.max(480, longer * 24)) / longer;
    const cell = D.stacks && fit >= 1 ? Math.floor(fit) : fit;
    // Rows are the queries, columns the keys (cross-attention: target down, source across).
    const map = heatmap({
      rows: T, cols: S, cell,
      rowText: (i, step) => (step === 1 ? ST.tokens[i] : `${i}: ${shortLabel(ST.tokens[i])}`),
      colText: (j, step) => (step === 1 ? ST.key_tokens[j] : `${j}: ${shortLabel(ST.key_tokens[j])}`),
      rowSpecial: (i) => ST.special[i], colSpecial: (j) => ST.key_special[j],
      paintInto: (canvas, width, height) => paint(canvas, a, width, height),
      hover: (i, j) => [
        el("div", { textContent: `query ${tokenLabel(i)} → key ${keyLabel(j)}` }),
        el("div", { className: "weight", dataset: { query: String(i), key: String(j) },
          textContent: masked(i, j) ? "masked: a causal model's query cannot see a later key"
            : `${valueName()} ${weightText(a[i * S + j], state.layer, state.head)}` }),
        ...(g ? [el("div", { className: "sides", textContent:
          `A ${g.a[i * S + j].toPrecision(6)} → B ${g.b[i * S + j].toPrecision(6)}` })] : []),
      ],
      zoomTo: zoomable() ? (i0, i1, j0, j1) => zoomTo({ q0: i0, q1: i1, k0: j0, k1: j1 }) : null,
    });
    section.append(
      el("p", { className: "hint", textContent: g
        ? `${layerTitle(LAYER[state.layer])}, head ${state.head}, B − A over the aligned tokens (A's and B's rows ` +
          `renormalised over them, as compare reads them): ${axes()}; JS divergence ${nats(moved(state.layer, state.head))} ` +
          `nats; largest |B − A| ${headMax(a).toFixed(3)}. A and B beside it. Hover a cell for its numbers; ↑/↓ layer, ←/→ head.`
        : `${layerTitle(LAYER[state.layer])}, ${perLayer(state.measure) ? `layers 0–${LAYER[state.layer]} composed` : `head ${state.head}`}: ${axes()}; ` +
        `max ${valueName()} ${headMax(a).toFixed(3)}. Hover a cell for its exact ${valueName()}; ↑/↓ layer${perLayer(state.measure) ? "" : ", ←/→ head"}.` +
        (zoomable() ? " Drag over the map to zoom: the server answers the exact cells of the region."
          : zoomWhy() ? ` (No zoom: ${zoomWhy()}.)` : "") }),
      measureNote(),
      legend(state.scale === "head" ? `${headMax(a).toFixed(3)} (the head's max)` : `${+top().toPrecision(3)}`),
      g ? el("div", { className: "beside-wrap" }, map, besides(g, Math.round(cell * S))) : map,
    );
  }

  // A heatmap and its labels, as the matrix view and a tile draw them: `rows` × `cols` cells
  // of `cell` px, labelled by `rowText(i, step)` and `colText(j, step)` (every one while rows
  // are tall enough to read, else every step-th, a round step that leaves a label's height
  // between labels, as in the PNGs; and the one under the mouse), coloured by `paintInto`;
  // `hover(i, j)` gives the tooltip's lines. With `zoomTo`, a drag over the map selects a
  // region of cells and calls zoomTo(i0, i1, j0, j1) (half-open) with it.
  function heatmap({ rows: nr, cols: nc, cell, rowText, colText, rowSpecial, colSpecial, paintInto, hover, zoomTo: onZoom = null }) {
    const [width, height] = [nc, nr].map((n) => Math.round(cell * n));
    const heat = el("canvas", { id: "matrix", width, height });
    const over = el("canvas", { id: "matrix-over", width, height });
    paintInto(heat, width, height);
    const frame = el("div", { className: "matrix-frame" }, heat, over);
    frame.style.width = `${width}px`;
    frame.style.height = `${height}px`;
    const every = cell >= 9;
    const font = every ? Math.min(13, cell * 0.8) : 12;
    const step = every ? 1 : D.label_steps.find((s) => s >= (2 * font) / cell) || Math.ceil((2 * font) / cell);
    const text = (i) => rowText(i, step);
    const keyText = (j) => colText(j, step);
    const rows = el("div", { className: "row-labels" });
    const cols = el("div", { className: "col-labels" });
    const rowLabel = (i, extra = "") => {
      const r = el("div", { textContent: text(i), className: (rowSpecial(i) ? "special" : "") + extra,
        dataset: { index: String(i) } });
      r.style.top = `${(i + 0.5) * cell - font * 0.75}px`;
      r.style.height = r.style.lineHeight = `${font * 1.5}px`;
      r.style.fontSize = `${font}px`;
      return r;
    };
    const colLabel = (i, extra = "") => {
      const c = el("div", { textContent: keyText(i), className: (colSpecial(i) ? "special" : "") + extra,
        dataset: { index: String(i) } });
      c.style.left = `${(i + 0.5) * cell}px`;
      c.style.fontSize = `${font}px`;
      return c;
    };
    for (let i = 0; i < nr; i += step) rows.append(rowLabel(i));
    for (let j = 0; j < nc; j += step) cols.append(colLabel(j));
    const hoverRow = rowLabel(0, " hover");
    const hoverCol = colLabel(0, " hover");
    hoverRow.hidden = hoverCol.hidden = true;
    rows.append(hoverRow);
    cols.append(hoverCol);
    // Any label can show on hover: room for the longest of each side.
    let longest = 0;
    for (let i = 0; i < nr; i++) longest = Math.max(longest, textWidth(text(i), font));
    let longestKey = 0;
    for (let j = 0; j < nc; j++) longestKey = Math.max(longestKey, textWidth(keyText(j), font));
    rows.style.height = `${height}px`;
    cols.style.width = `${width}px`;
    rows.style.width = `${Math.ceil(longest) + 14}px`;
    cols.style.height = `${Math.ceil(longestKey * Math.sin(Math.PI / 3) + font) + 8}px`; // rotated 60°
    const wrap = el("div", { className: "matrix-wrap" }, el("span"), cols, rows, frame);
    // The hovered token's label, on top; the labels it would overlap step aside meanwhile.
    const place = (label, i, vertical) => {
      label.hidden = false;
      label.textContent = vertical ? text(i) : keyText(i);
      label.dataset.index = String(i);
      if (vertical) label.style.top = `${(i + 0.5) * cell - font * 0.75}px`;
      else label.style.left = `${(i + 0.5) * cell}px`;
      for (const other of (vertical ? rows : cols).children) {
        if (other === label) continue;
        other.classList.toggle("covered", Math.abs(+other.dataset.index - i) * cell < font * 1.5);
      }
    };
    const octx = over.getContext("2d");
    const cellAt = (e) => {
      const r = over.getBoundingClientRect();
      return [Math.max(0, Math.min(nr - 1, Math.floor(((e.clientY - r.top) / r.height) * nr))),
        Math.max(0, Math.min(nc - 1, Math.floor(((e.clientX - r.left) / r.width) * nc)))];
    };
    let dragged = null; // [i, j] where a drag began
    over.addEventListener("pointermove", (e) => {
      const [i, j] = cellAt(e);
      octx.clearRect(0, 0, width, height);
      if (dragged) { // the region a drag selects: its outline, the rest dimmed
        const [i0, i1, j0, j1] = [Math.min(i, dragged[0]), Math.max(i, dragged[0]) + 1,
          Math.min(j, dragged[1]), Math.max(j, dragged[1]) + 1];
        octx.fillStyle = "rgba(0,0,0,0.35)";
        octx.fillRect(0, 0, width, height);
        octx.clearRect(j0 * cell, i0 * cell, (j1 - j0) * cell, (i1 - i0) * cell);
        octx.strokeStyle = "#fff";
        octx.strokeRect(j0 * cell + 0.5, i0 * cell + 0.5, (j1 - j0) * cell - 1, (i1 - i0) * cell - 1);
      } else {
        octx.fillStyle = "rgba(255,255,255,0.22)";
        octx.fillRect(0, i * cell, width, cell);
        octx.fillRect(j * cell, 0, cell, height);
        octx.strokeStyle = "#fff";
        octx.strokeRect(j * cell + 0.5, i * cell + 0.5, Math.max(1, cell - 1), Math.max(1, cell - 1));
      }
      place(hoverRow, i, true);
      place(hoverCol, j, false);
      tooltip.hidden = false;
      tooltip.replaceChildren(...hover(i, j));
      tooltip.style.left = `${e.pageX + 14}px`;
      tooltip.style.top = `${e.pageY + 14}px`;
    });
    over.addEventListener("pointerleave", () => {
      octx.clearRect(0, 0, width, height);
      tooltip.hidden = true;
      hoverRow.hidden = hoverCol.hidden = true;
      for (const label of wrap.querySelectorAll(".covered")) label.classList.remove("covered");
    });
    if (onZoom) {
      over.classList.add("zooms");
      over.addEventListener("pointerdown", (e) => {
        e.preventDefault(); // no text selection; the form's box lets go of the keys (↑/↓, ←/→)
        if (document.activeElement instanceof HTMLElement) document.activeElement.blur();
        over.setPointerCapture(e.pointerId); // the drag goes on outside the map
        dragged = cellAt(e);
      });
      // A click is no zoom: a region is at least two cells on a side.
      over.addEventListener("pointerup", (e) => {
        if (!dragged) return;
        const [i, j] = cellAt(e);
        const [i0, i1, j0, j1] = [Math.min(i, dragged[0]), Math.max(i, dragged[0]) + 1,
          Math.min(j, dragged[1]), Math.max(j, dragged[1]) + 1];
        dragged = null;
        octx.clearRect(0, 0, width, height);
        if (i1 - i0 > 1 || j1 - j0 > 1) onZoom(i0, i1, j0, j1);
      });
    }
    return wrap;
  }

  // ---------- zoom: tiles from the server (attnviz serve) ----------
  // The served page asks its server for the exact cells of a region of one head (a tile,
  // recomputed from the layer's X); a region longer than the server's tile side on a side is
  // answered pooled, each cell the mean or max of a block of cells. Offline there is no zoom.
  // Why the matrix view cannot zoom now ("": it can; null: no zoom on this page at all).
  function zoomWhy() {
    if (!tiles || C || D.stacks) return null;
    if (perLayer(state.measure)) return `${state.measure} has one map per layer: zooming shows weights and norm`;
    if (D.unit !== "token" || D.hidden_special) return "zooming shows the model's tokens: uncheck words and hide special";
    return "";
  }
  const zoomable = () => zoomWhy() === "";
  const WHOLE = () => ({ q0: 0, q1: T, k0: 0, k1: S });
  const isWhole = (z) => z.q0 === 0 && z.q1 === T && z.k0 === 0 && z.k1 === S;
  function zoomTo(z) {
    state.zoom = isWhole(z) ? null : z;
    render();
  }
  // The region twice as long on each side around its centre, within the matrix.
  function zoomedOut(z) {
    const wider = (a, b, n) => {
      const length = Math.min(n, 2 * (b - a));
      const start = Math.max(0, Math.min(n - length, Math.round((a + b - length) / 2)));
      return [start, start + length];
    };
    const [q0, q1] = wider(z.q0, z.q1, T);
    const [k0, k1] = wider(z.k0, z.k1, S);
    return { q0, q1, k0, k1 };
  }
  async function tileView(section) {
    const z = state.zoom || WHOLE();
    const buttons = el("div", { className: "zoom-buttons" },
      el("button", { type: "button", id: "zoom-whole", textContent: "whole map", onclick: () => zoomTo(WHOLE()) }),
      el("button", { type: "button", id: "zoom-out", textContent: "zoom out", onclick: () => zoomTo(zoomedOut(z)) }));
    buttons.querySelectorAll("button").forEach((b) => { b.disabled = isWhole(z); });
    let t;
    try {
      t = await tiles.ask({ layer: LAYER[state.layer], head: state.head, ...z, measure: state.measure, pool: state.pool });
    } catch (err) {
      section.append(buttons, el("p", { className: "error", id: "tile-error", textContent: `tile: ${err.message}` }));
      return;
    }
    const [nr, nc] = t.shape;
    const [bq, bk] = t.block;
    const pooled = bq > 1 || bk > 1;
    // Cell i of the tile holds queries first(i) … last(i) (one, unless pooled); so for keys.
    const span = (start, stop, b) => (i) => [start + i * b, Math.min(start + (i + 1) * b, stop) - 1];
    const rowsOf = span(t.q0, t.q1, bq);
    const colsOf = span(t.k0, t.k1, bk);
    let tileMax = 0;
    for (const v of t.values) if (v > tileMax) tileMax = v;
    const own = state.scale === "head" || top() === null; // the tile's max is 1 on the scale
    const max = own ? tileMax || 1 : top();
    const longer = Math.max(nr, nc);
    const cell = Math.min(720, Math.max(480, longer * 24)) / longer;
    const label = (tokens, [a, b], step) => (a === b ? `${a}: ${step === 1 ? tokens[a] : shortLabel(tokens[a])}` : `${a}–${b}`);
    // A cell no query of it can see (a causal model's later keys): hatched, as in the matrix.
    const hidden = (i, j) => Number.isNaN(t.values[i * nc + j]) || (!pooled && masked(t.q0 + i, t.k0 + j));
    function paintTile(canvas, width, height) {
      const ctx = canvas.getContext("2d");
      const img = ctx.createImageData(width, height);
      for (let y = 0; y < height; y++) {
        const i = Math.min(nr - 1, Math.floor(y / cell));
        for (let x = 0; x < width; x++) {
          const j = Math.min(nc - 1, Math.floor(x / cell));
          setPixel(img.data, 4 * (y * width + x), hidden(i, j) ? maskedAt(x, y) : colourOf(t.values[i * nc + j], max, false));
        }
      }
      ctx.putImageData(img, 0, 0);
    }
    const map = heatmap({
      rows: nr, cols: nc, cell,
      rowText: (i, step) => label(ST.tokens, rowsOf(i), step),
      colText: (j, step) => label(ST.key_tokens, colsOf(j), step),
      rowSpecial: (i) => !pooled && ST.special[t.q0 + i], colSpecial: (j) => !pooled && ST.key_special[t.k0 + j],
      paintInto: paintTile,
      hover: (i, j) => {
        const [[a, b], [c, d]] = [rowsOf(i), colsOf(j)];
        const v = t.values[i * nc + j];
        return [
          el("div", { textContent: pooled ? `queries ${a}–${b} → keys ${c}–${d}` : `query ${tokenLabel(a)} → key ${keyLabel(c)}` }),
          el("div", { className: "weight", dataset: { query: String(a), key: String(c), ...(pooled ? { pooled: t.pool } : {}) },
            textContent: hidden(i, j) ? "masked: a causal model's query cannot see a later key"
              : pooled ? `${t.pool} ${valueName()} of ${(b - a + 1) * (d - c + 1)} cells: ${v.toPrecision(6)}`
                : `${valueName()} ${v.toPrecision(6)}` }),
        ];
      },
      zoomTo: (i0, i1, j0, j1) => zoomTo({ q0: rowsOf(i0)[0], q1: rowsOf(i1 - 1)[1] + 1,
        k0: colsOf(j0)[0], k1: colsOf(j1 - 1)[1] + 1 }),
    });
    map.dataset.q0 = String(t.q0);
    map.dataset.q1 = String(t.q1);
    map.dataset.k0 = String(t.k0);
    map.dataset.k1 = String(t.k1);
    map.id = "tile";
    const where = `queries ${t.q0}–${t.q1 - 1} × keys ${t.k0}–${t.k1 - 1}`;
    section.append(
      el("p", { className: "hint", id: "tile-hint", textContent:
        `${layerTitle(LAYER[state.layer])}, head ${state.head}: ${where}${isWhole(z) ? " (the whole text)" : ""}, ` +
        (pooled ? `pooled: each cell the ${t.pool} of a block of ${bq} × ${bk} cells (over the cells its queries see), `
          : "every cell exact, ") +
        "recomputed by the server from the layer's X. Drag to zoom in; ↑/↓ layer, ←/→ head keep the region." }),
      ...(D.tiles_only ? [el("p", { className: "note", textContent: D.tiles_only })] : []),
      buttons,
      measureNote(),
      legend(own ? `${tileMax.toFixed(3)} (the tile's max)` : `${+top().toPrecision(3)}`),
      map,
    );
  }
  // A compare page's A and B of the head in the matrix view, beside B − A: each over the
  // aligned tokens, rows renormalised, on the colour map from 0 to 1 (or the head's max).
  function besides(g, width) {
    const size = Math.round(width / 2);
    return el("div", { className: "besides" }, ...["a", "b"].map((name) => {
      const c = el("canvas", { id: `matrix-${name}`, width: size, height: size });
      paint(c, g[name], size, size, false, state.scale === "head" ? headMax(g[name]) || 1 : 1);
      return el("figure", {}, el("figcaption", { textContent: `${name.toUpperCase()} (0–` +
        `${state.scale === "head" ? "its max" : "1"}): ${shortened(name === "a" ? D.text : C.text_b, 40)}` }), c);
    }));
  }

  // ---------- query view ----------
  async function queryView(section) {
    const i = Math.min(state.query, T - 1);
    const all = await Promise.all([...Array(L * H).keys()].map((n) => head(Math.floor(n / H), n % H)));
    const rows = ST.diff ? await rowsMoved : null; // B − A: each head's divergence at this query
    const table = el("table", { className: "query-table" });
    const header = el("tr", {}, el("th"));
    for (let h = 0; h < H; h++) header.append(el("th", { textContent: headName(h) }));
    table.append(header);
    for (let l = 0; l < L; l++) {
      const row = el("tr", {}, el("th", { textContent: `L${LAYER[l]}` }));
      for (let h = 0; h < H; h++) {
        if (isRemoved(l, h)) {
          row.append(el("td", { className: "removed", textContent: "removed", title: D.removed.note }));
          continue;
        }
        const a = all[l * H + h];
        // The most-attended keys; for B − A, the keys whose weight changed most either way.
        const size = (w) => (ST.diff ? Math.abs(w) : w);
        const keys = [...Array(S).keys()].filter((j) => allowed(i, j))
          .sort((x, y) => size(a[i * S + y]) - size(a[i * S + x])).slice(0, 3);
        const cell = el("td");
        if (rows) {
          cell.append(el("div", { className: "js", textContent: `JS ${nats(rows[(l * H + h) * T + i])}` }));
        }
        for (const j of keys) {
          const w = a[i * S + j];
          const bar = el("span", { className: "bar" + (ST.diff ? (w > 0 ? " more" : " less") : "") });
          bar.style.width = `${Math.round((size(w) / top()) * 100)}%`;
          cell.append(el("div", { className: "key" + (ST.key_special[j] ? " special" : ""),
            title: `${keyLabel(j)}: ${weightText(w, l, h)}` },
          bar, el("span", { textContent: `${ST.key_tokens[j]} ${ST.diff && w > 0 ? "+" : ""}${w.toFixed(2)}` })));
        }
        row.append(cell);
      }
      table.append(row);
    }
    section.append(
      W && W.steps ? stepper(i) : "",
      el("p", { className: "hint", textContent: ST.diff
        ? `How the row of “${ST.tokens[i]}” (aligned position ${i}) moved from A to B in every head: its JS ` +
          "divergence (nats), and the three aligned keys whose weight changed most (B − A, rows renormalised " +
          "over the aligned keys; bars: red more in B, blue more in A)."
        : `Where “${ST.tokens[i]}” (position ${i}) looks: its three most-attended ${D.stacks ? tokensOf(1) : "keys"} in every head` +
        (D.stacks ? ` of the ${STACK_NAMES[state.stack][0].toLowerCase()}` : "") +
        (state.measure === "weights" ? "." : `, by ${state.measure}.`) }),
      measureNote(),
      table,
    );
  }

  // Step k of the continuation: the token at W.start + k, written from the row before it,
  // which is the query shown; ← and → step.
  function stepper(i) {
    const n = W.probs.length;
    const k = i + 1 - W.start; // the step whose writing row is query i
    const go = (to) => { state.query = W.start + to - 1; render(); };
    const bar = el("p", { className: "stepper", id: "stepper" },
      el("button", { type: "button", textContent: "◀", disabled: k <= 0, onclick: () => go(Math.max(0, k - 1)) }),
      el("button", { type: "button", textContent: "▶", disabled: k >= n - 1, onclick: () => go(Math.min(n - 1, k + 1)) }),
      " ");
    if (k < 0 || k >= n) {
      bar.append(el("button", { type: "button", textContent: `step through the ${n} ${W.generated ? "written" : "given"} tokens`,
        onclick: () => go(0) }));
    } else {
      const t = W.start + k;
      bar.append(el("span", { textContent: `step ${k + 1} of ${n}: the model ${W.generated ? "wrote" : "read"} ` }),
        el("strong", { className: "written", textContent: `“${ST.tokens[t]}”` }),
        el("span", { textContent: ` (p = ${W.probs[k].toFixed(3)}) from the row of “${ST.tokens[i]}” (position ${i}), shown below` }));
    }
    return bar;
  }

  // ---------- inside one head ----------
  const vec = (xs) => Array.from(xs, (x) => x.toFixed(3)).join("  ");
  // A table cell of a k_h or v_h: its first numbers whole, "… N more", all of them on hover.
  const SHOWN = 6;
  function vecCell(xs) {
    const td = el("td", { className: "vec", title: vec(xs) });
    td.append(Array.from(xs.subarray(0, SHOWN), (x) => x.toFixed(3).padStart(6)).join(" "));
    if (xs.length > SHOWN) td.append(el("span", { className: "more", textContent: ` … ${xs.length - SHOWN} more` }));
    return td;
  }
  // An encoder-decoder stack's inside view names its sides: cross-attention's queries are the
  // target's tokens, its keys and values the source's (the encoder's last hidden states).
  function insideSource() {
    if (!D.stacks) return "Q_h, K_h and V_h come from attnviz/core/mha.py (X W^h + b^h for this layer's real input X); ";
    if (state.stack !== "cross") {
      return `Q_h, K_h and V_h come from attnviz/core/mha.py (X W^h + b^h for this layer's real input X, the ${sideName(0)} tokens); `;
    }
    return "Q_h comes from attnviz/core/mha.py (X W_Q^h + b for this decoder layer's real input X, the target tokens), " +
      "K_h and V_h from the encoder's last hidden states (the source tokens); ";
  }
  // B − A inside one head: the query's row in A and in B over the aligned keys, and B − A.
  async function insideDiff(section) {
    const [l, h, u] = [state.layer, state.head, Math.min(state.query, T - 1)];
    const g = await aligned(l, h);
    const rows = await rowsMoved;
    const table = el("table", { className: "inside-table diff-table" });
    table.append(el("tr", {}, ...["key (aligned)", "A", "B", "B − A"].map((t) => el("th", { textContent: t }))));
    for (let k = 0; k < T; k++) {
      const [x, y] = [g.a[u * T + k], g.b[u * T + k]];
      const bar = el("span", { className: "bar" + (y - x > 0 ? " more" : " less") });
      bar.style.width = `${Math.round(Math.abs(y - x) * 100)}%`;
      table.append(el("tr", { dataset: { key: String(k) } },
        el("td", { className: "tok", textContent: `${k}: ${ST.tokens[k]}` }),
        el("td", { textContent: x.toPrecision(6) }),
        el("td", { textContent: y.toPrecision(6) }),
        el("td", { className: "prob" }, bar, el("span", { textContent: `${y - x > 0 ? "+" : ""}${(y - x).toPrecision(6)}` })),
      ));
    }
    section.append(
      el("p", { className: "hint", textContent:
        `Layer ${LAYER[l]}, head ${h}, query “${ST.tokens[u]}” (aligned position ${u}): A's and B's softmax row ` +
        "over the aligned keys (each renormalised over them, as compare reads them), and B − A. " +
        `JS divergence of this row: ${nats(rows[(l * H + h) * T + u])} nats; of the head (mean over the aligned ` +
        `queries): ${nats(moved(l, h))} nats.` }),
      table,
      el("p", { className: "note", textContent: "The from-scratch steps (q_h, each k_h, q·k, the softmax, v_h) " +
        "of each text are in this view with Text A or Text B chosen." }),
    );
  }
  async function insideView(section) {
    if (ST.diff) return insideDiff(section);
    const I = ST.inside;
    if (!I) {
      section.append(el("p", { className: "note", textContent: `Inside one head: ${ST.inside_note}` }));
      return;
    }
    const n = I.tokens.length;
    const keyTokens = I.key_tokens || I.tokens; // cross-attention: the source's
    const nk = keyTokens.length;
    const heads = I.heads || ST.heads;
    const dk = I.d_k;
    const i = Math.min(state.query, n - 1);
    const [l, h] = [LAYER[state.layer], state.head]; // a model layer: I holds every layer
    const unpack = (blob) => inflate(blob).then((b) => floats(b.slice()));
    const [Q, K, V] = await Promise.all(["q", "k", "v"].map((m) => unpack(I[m][l][h])));
    const bias = I.bias ? await unpack(I.bias[h]) : null; // T5: B_h (T × S), every layer's
    const errors = new Float64Array((await inflate(I.errors)).buffer);
    const q = Q.subarray(i * dk, (i + 1) * dk);
    const { scale, softcap, window: span, band } = I.scores[l];
    const visible = [...Array(nk).keys()].filter(
      (j) => (!ST.causal || j <= i) && (span === null || j > i - span) &&
        (band === null || Math.abs(j - i) <= band)); // a local layer: ±band about the query
    const dots = visible.map((j) => {
      let s = 0;
      for (let c = 0; c < dk; c++) s += q[c] * K[j * dk + c];
      return s;
    });
    const biasOf = (j) => (bias ? bias[i * nk + j] : 0);
    const scores = dots.map((s, r) => (softcap === null ? s * scale : softcap * Math.tanh((s * scale) / softcap)) + biasOf(visible[r]));
    const top = Math.max(...scores);
    const exps = scores.map((s) => Math.exp(s - top));
    const total = exps.reduce((x, y) => x + y, 0);
    const probs = exps.map((e) => e / total);
    const out = new Float64Array(dk);
    visible.forEach((j, n2) => { for (let c = 0; c < dk; c++) out[c] += probs[n2] * V[j * dk + c]; });
    const sameTokens = D.unit === "token" && !D.hidden_special && T === n && S === nk;
    const model = sameTokens ? await head(state.layer, h) : null;

    const table = el("table", { className: "inside-table" });
    const scored = (softcap === null ? "q·k · scale" : "cap·tanh(q·k · scale / cap)") + (bias ? " + B_h" : "");
    const columns = [D.stacks ? `key (${sideName(1)})` : "key", "k_h", "q·k", ...(bias ? ["B_h"] : []), scored, "softmax", "model", "v_h"];
    table.append(el("tr", {}, ...columns.map((t) => el("th", { textContent: t }))));
    let live = 0;
    visible.forEach((j, r) => {
      const m = model ? model[i * S + j] : null;
      if (m !== null) live = Math.max(live, Math.abs(m - probs[r]));
      const bar = el("span", { className: "bar" });
      bar.style.width = `${Math.round(probs[r] * 100)}%`;
      table.append(el("tr", {},
        el("td", { className: "tok", textContent: `${j}: ${keyTokens[j]}` }),
        vecCell(K.subarray(j * dk, (j + 1) * dk)),
        el("td", { textContent: dots[r].toFixed(4) }),
        ...(bias ? [el("td", { className: "bias", textContent: biasOf(j).toFixed(4) })] : []),
        el("td", { textContent: scores[r].toFixed(4) }),
        el("td", { className: "prob" }, bar, el("span", { textContent: probs[r].toPrecision(6) })),
        el("td", { textContent: m === null ? "–" : m.toPrecision(6) }),
        vecCell(V.subarray(j * dk, (j + 1) * dk)),
      ));
    });
    const checks0 = [];
    const rowError = errors[(l * heads + h) * n + i];
    let headError = 0;
    for (let k = 0; k < n; k++) headError = Math.max(headError, errors[(l * heads + h) * n + k]);
    if (!sameTokens) {
      checks0.push("The formulas run on the model's tokens; this page's other views show " +
        `${D.unit === "word" ? "words" : "tokens"}${D.hidden_special ? " without special tokens" : ""}, ` +
        "so the model column is left empty here.");
    }
    const checks = [
      `attnviz/core/mha.py in float64 against the model's probabilities: max |Δ| = ` +
        `${rowError.toExponential(2)} for this query, ${headError.toExponential(2)} over all queries of this head.`,
    ];
    if (model && ST.encoding === "float32") {
      checks.push(`This page's softmax above against the model's weights: max |Δ| = ${live.toExponential(2)}.`);
    }
    section.append(
      isRemoved(state.layer, h) ? el("p", { className: "note removed", textContent:
        `Layer ${l}, head ${h} was removed (--ablate): the pass set its head_h (step 5) to 0 before ` +
        "W_O, so nothing downstream read it; the steps below are what it computed." }) : "",
      el("p", { className: "hint", textContent:
        `${layerTitle(l)}, head ${h}, query “${I.tokens[i]}” (position ${i}); d_k = ${dk}, ` +
        `scale = ${scale.toPrecision(6)}${Math.abs(scale - 1 / Math.sqrt(dk)) < 1e-12 ? " = 1/√d_k" : ""}` +
        `${softcap === null ? "" : `, soft cap ${softcap}`}${span === null ? "" : `, window ${span}`}` +
        `${band === null ? "" : `, keys within ±${band} (a local layer)`}` +
        `${bias ? ", plus T5's relative position bias B_h (one learned number per head and distance j − i)" : ""}. ` +
        insideSource() +
        "the scores, softmax and weighted sum below are those formulas applied to them." }),
      el("h3", { textContent: "1. q_h = x W_Q^h + b_Q^h" }),
      el("pre", { className: "vec", id: "inside-q", textContent: vec(q) }),
      el("h3", { textContent: `2–4. each ${D.stacks ? `${sideName(1)} ` : ""}key: k_h, q·k, scaled (q·k/√d_k)${bias ? " + B_h" : ""}, softmax over keys` }),
      el("p", { className: "hint", textContent:
        `k_h and v_h show their first ${Math.min(SHOWN, dk)} of ${dk} numbers; hover one for all of them.` }),
      table,
      el("h3", { textContent: "5. head_h = Σ softmax · v_h" }),
      el("pre", { className: "vec", id: "inside-out", textContent: vec(out) }),
      el("h3", { textContent: "Cross-check" }),
      ...checks.map((c) => el("p", { className: "check", textContent: c })),
      ...checks0.map((c) => el("p", { className: "note", textContent: c })),
    );
  }

  // ---------- keyboard ----------
  document.onkeydown = (e) => {
    const typing = e.target instanceof HTMLInputElement || e.target instanceof HTMLTextAreaElement;
    if (typing || e.target instanceof HTMLSelectElement || e.altKey || e.ctrlKey || e.metaKey) return;
    const step = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] }[e.key];
    if (step && state.view === "query" && W && W.steps && step[0] === 0) { // a step of the continuation
      e.preventDefault();
      state.query = Math.min(W.start + W.probs.length - 2, Math.max(W.start - 1, state.query + step[1]));
      render();
      return;
    }
    if (!step || state.view === "model" || state.view === "query") return;
    e.preventDefault();
    state.layer = Math.min(L - 1, Math.max(0, state.layer + step[0]));
    state.head = Math.min(H - 1, Math.max(0, state.head + step[1]));
    render();
  };

  show(VIEWS.some(([v]) => v === initial.view) ? initial.view : VIEWS[0][0]);
  return rendering.then(() => { document.body.dataset.ready = "1"; });
}

// An offline page opens on the view, layer, head, query and measure its URL's fragment names
// (page.html#view=matrix&layer=3&head=1&query=5) and keeps the fragment current as the reader
// moves, so a link shows what its sender saw. (serve's live.js keeps its own fragment.)
const FRAGMENT = ["view", "layer", "head", "query", "measure", "side"];
function fromFragment() {
  const p = new URLSearchParams(location.hash.slice(1));
  const found = {};
  for (const key of ["layer", "head", "query"]) if (p.has(key)) found[key] = +p.get(key);
  for (const key of ["view", "measure"]) if (p.has(key)) found[key] = p.get(key);
  if (p.has("side")) found.stack = p.get("side");
  return found;
}
function toFragment(state) {
  const p = new URLSearchParams();
  for (const key of FRAGMENT.slice(0, 4)) p.set(key, String(state[key]));
  if (state.measure !== "weights") p.set("measure", state.measure);
  if (state.stack !== "only") p.set("side", state.stack);
  history.replaceState(null, "", `#${p}`);
}

{
  const data = JSON.parse(document.getElementById("attnviz-data").textContent);
  if (!data.live) draw(data, fromFragment(), toFragment); // live: live.js draws each text
}
