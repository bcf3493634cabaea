// attnviz page, a vision-language model's answer over its picture (its page only): the
// answer's words to click (the whole answer first: the mean of the rows that wrote its
// tokens); for the chosen word and layer, every head's row drawn over the picture side by
// side, each image token's value on its cell (page.py's layout_entry: the cells' edges as
// Layout.edges puts them), on one colour scale for the layer (0 to its largest cell value, as
// picture-answer-layer-L.png); and the picture's share of the chosen word's attention by
// layer as a plot (each head a thin line, their mean thick). Drawn in a section of its own
// above page.js's views; the weights are the page's, decoded by blobs.js. A model that reads
// the picture in cross-attention layers (Mllama's: page.py's cross_entry) has the same view
// of those layers, from their own weights (each token over the picture's keys, every tile's
// CLS then its patches), the shares on the patches.
"use strict";

function drawAnswer(D) {
  const cross = !D.layout; // D.cross: its own layers, weights and keys
  const A = D.layout || D.cross;
  const own = cross ? A : D; // whose layers, heads and weights
  const [W, HT] = A.size;
  const K = cross ? A.keys : D.tokens.length; // a row's keys
  const state = { layer: 0, view: 0 };
  const { inflate, decode, el, overlay, serialRender } = attnvizBlobs;
  const heads = new Map();
  function head(l, h) {
    const key = `${l}/${h}`;
    if (!heads.has(key)) heads.set(key, decode(own.weights[l][h], own.encoding));
    return heads.get(key);
  }
  const pixels = inflate(A.pixels); // (HT, W, 3) uint8, row-major
  const over = overlay(A, D.colours, K); // each key's value on its cell (blobs.js)
  const what = cross ? "patches" : "picture"; // what a share is of
  const layerName = (l) => cross ? `Cross-attention layer ${own.layer_ids[l]}` : `Layer ${own.layer_ids[l]}`;

  // The mean of the view's rows in a head: float64 sums of its float32 values, in order.
  function rowOf(grid, rows) {
    const out = new Float64Array(K);
    for (const q of rows) for (let k = 0; k < K; k++) out[k] += grid.values[q * K + k];
    return out.map((v) => v / rows.length);
  }

  // ---------- the section ----------
  const SVG = "http://www.w3.org/2000/svg";
  const svg = (tag, attrs = {}, ...children) => {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    node.append(...children);
    return node;
  };
  const section = el("section", { id: "answer-view", className: "picture-view" });
  const header = document.querySelector("#app > header");
  if (header) header.after(section, el("h2", { className: "picture-below", textContent: cross
    ? "Below: the page's views of the self-attention layers, over the text alone (the picture is read " +
      "in the cross-attention layers above)"
    : "Below: the page's views of the same attention, the image tokens as a sequence of tokens" }));
  else document.body.prepend(section);

  const render = serialRender(section, () => view());

  // The words of the answer: one button each, the whole answer first.
  function words() {
    return el("div", { className: "answer-words", id: "answer-words", role: "group" },
      ...A.views.map((v, n) => el("button", { type: "button", className: "answer-word", textContent: v.label,
        title: v.about, "aria-pressed": String(n === state.view), dataset: { view: String(n) },
        onclick: () => { state.view = n; render(); } })));
  }
  function layers() {
    const s = el("select", { id: "answer-layer", onchange: (e) => { state.layer = +e.target.value; render(); } });
    for (let l = 0; l < own.layers; l++) s.append(el("option", { value: String(l), textContent: `${own.layer_ids[l]}` }));
    s.value = String(state.layer);
    return el("label", { className: "control" }, cross ? "Cross-attention layer " : "Layer ", s);
  }

  async function view() {
    const l = state.layer;
    const chosen = A.views[state.view];
    const grids = await Promise.all([...Array(own.heads).keys()].map((h) => head(l, h)));
    const picture = await pixels;
    const values = grids.map((g) => over.painted(rowOf(g, chosen.rows)));
    const top = over.top(values);
    const panels = values.map((v, h) => {
      const canvas = over.canvas({ className: "head-picture", dataset: { head: String(h) } });
      over.paint(canvas, picture, v, top);
      const share = chosen.share[l][h];
      return el("figure", { className: "picture-head" }, canvas,
        el("figcaption", { textContent: `H${h} · ${what} ${(100 * share).toFixed(1)}%` }));
    });
    const tiles = A.parts.map((p) => `${p.grid[0]} × ${p.grid[1]}`).join(" + ");
    const each = cross
      ? `its cross-attention layers' keys are its tiles' patches (${tiles}), each patch's attention over its ` +
        "cell (each tile's CLS is a key too, on no cell: a share is the patches' alone), "
      : "each image token's attention over its cell, ";
    section.replaceChildren(
      el("h2", { textContent: cross ? "The answer over the picture, in the cross-attention layers" : "The answer over the picture" }),
      el("p", { className: "hint", textContent: `Click a word of the answer to see where each head looked as it ` +
        `was written (the row before it); the first button is the mean of those rows. ${A.name}, ` +
        `${A.given[0]} × ${A.given[1]} px, drawn at ${W} × ${HT}: ${each}` +
        "colour over the picture at 60%, one scale for the layer's heads" +
        (over.faded ? `; the parts of the picture no ${cross ? "patch" : "image token"} stands for are faded.` : ".") }),
      words(),
      el("div", { className: "controls" }, layers()),
      el("h3", { id: "answer-title", textContent: `${layerName(l)}: ${chosen.about}` }),
      over.legend(top, cross ? "attention on a patch's key" : "attention on an image token", "answer-legend"),
      el("div", { className: "picture-heads", id: "answer-heads", dataset: { top: String(top) } }, ...panels),
      el("h3", { textContent: cross ? "The patches' share of this cross-attention, by cross-attention layer"
        : "The picture's share of this attention, by layer" }),
      plot(chosen),
    );
  }

  // Each head's share by layer (thin grey), their mean (thick), the chosen layer marked; a
  // click on a layer's column shows that layer above.
  function plot(chosen) {
    const L = own.layers;
    const [pw, ph, left, bottom] = [Math.max(240, 40 * L), 180, 44, 30];
    const x = (l) => left + (L > 1 ? (l * (pw - left - 12)) / (L - 1) : (pw - left) / 2);
    const y = (v) => 8 + (1 - v) * (ph - bottom - 8);
    const line = (vs, attrs) => svg("polyline", { points: vs.map((v, l) => `${x(l)},${y(v)}`).join(" "),
      fill: "none", ...attrs });
    const mean = chosen.share.map((row) => row.reduce((s, v) => s + v, 0) / row.length);
    const chart = svg("svg", { id: "answer-share", width: pw, height: ph, role: "img",
      "aria-label": cross ? "the patches' share of attention by layer" : "the picture's share of attention by layer", "data-mean": JSON.stringify(mean) });
    for (const v of [0, 0.5, 1]) {
      chart.append(svg("line", { x1: left, x2: pw - 8, y1: y(v), y2: y(v), stroke: "#ddd" }),
        svg("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end", "font-size": 10 }, `${v}`));
    }
    for (let h = 0; h < own.heads; h++) {
      chart.append(line(chosen.share.map((row) => row[h]), { stroke: "#bbb", "stroke-width": 1, class: "head-line" }));
    }
    chart.append(line(mean, { stroke: "#1f77b4", "stroke-width": 2.5, class: "mean-line" }));
    for (let l = 0; l < L; l++) {
      chart.append(svg("circle", { cx: x(l), cy: y(mean[l]), r: l === state.layer ? 5 : 3,
        fill: l === state.layer ? "#d62728" : "#1f77b4" }),
      svg("text", { x: x(l), y: ph - 10, "text-anchor": "middle", "font-size": 10 }, `${own.layer_ids[l]}`),
      svg("rect", { x: x(l) - 8, y: 0, width: 16, height: ph, fill: "transparent", class: "layer-pick",
        "data-layer": l }));
    }
    chart.addEventListener("click", (e) => {
      const pick = e.target.closest(".layer-pick");
      if (pick) { state.layer = +pick.dataset.layer; render(); }
    });
    return el("figure", { className: "answer-plot" }, chart,
      el("figcaption", { textContent: `x: ${cross ? "cross-attention layer" : "layer"}; y: share of the rows on ` +
        `the picture's ${cross ? "patches" : "tokens"}. Thick: the mean of the heads; thin: each head; red: the ` +
        "layer shown above (click a layer to show it)." }));
  }

  return render();
}

{
  const data = JSON.parse(document.getElementById("attnviz-data").textContent);
  if (data.layout || data.cross) drawAnswer(data).then(() => { document.body.dataset.answer = "ready"; });
}
