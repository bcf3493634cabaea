// attnviz page, over the picture (a vision model's page only): the picture as the model saw
// it with one query's row over the patches blended on it (CLS's by default, as
// picture-layer-L.png draws it); hovering a patch shows its row, a click pins it; the tokens
// outside the grid (CLS, dist, registers) named with their shares; every head of the layer as
// a small picture. It is drawn in a section of its own above page.js's views, with its own
// layer, head, query, measure and colour-scale controls.
// Why its own decoding (blobs.js, shared with answer.js, not page.js's): page.js is inlined
// in every text's page, whose bytes stay as they are; its helpers live inside its draw().
// Offline, like page.js.
"use strict";

function drawPicture(D) {
  const PIC = D.picture;
  const [ROWS, COLS] = PIC.grid;
  const N = ROWS * COLS;
  const [W, HT] = PIC.size; // the pixels the patches cover
  const FIRST = PIC.first; // the first patch's token; the ones before are outside the grid
  const T = D.tokens.length;
  const ALPHA = 0.6; // the colours' share over the picture, as in the PNGs
  const MEASURES = Object.fromEntries(Object.entries(D.measures || {}).filter(([, m]) => !m.per_layer));
  const HOME = FIRST > 0 ? 0 : FIRST; // CLS where the model has one, else patch (0, 0)
  const state = { layer: 0, head: 0, query: HOME, measure: MEASURES[D.measure] ? D.measure : "weights",
    scale: "layer" };
  const REMOVED = new Set(((D.removed && D.removed.heads) || []).map(([l, h]) => `${l}/${h}`));
  const isRemoved = (l, h) => REMOVED.has(`${D.layer_ids[l]}/${h}`);
  const tokenOf = (r, c) => FIRST + r * COLS + c;
  const isPatch = (i) => i >= FIRST && i < FIRST + N;

  // ---------- the heads, decoded once ----------
  const { inflate, floats, decode, el, serialRender } = attnvizBlobs;
  const heads = new Map();
  // A head of the shown measure; norm is the weights times each key's ‖f(x_j)‖ where given.
  function head(l, h, m = state.measure) {
    const key = `${m}/${l}/${h}`;
    if (!heads.has(key)) {
      const M = MEASURES[m];
      let made;
      if (m === "weights") made = decode(D.weights[l][h], D.encoding);
      else if (M.lengths) {
        made = Promise.all([head(l, h, "weights"), inflate(M.lengths[l][h])]).then(([a, b]) => {
          const lengths = floats(b.slice());
          // exact where the weights are (float32), else from 8-bit weights (step undefined)
          return { values: a.values.map((x, n) => x * lengths[n % T]), step: a.step === null ? null : undefined };
        });
      } else made = decode(M.blobs[l][h], M.encoding);
      heads.set(key, made);
    }
    return heads.get(key);
  }
  const exact = () => (state.measure === "weights" || MEASURES[state.measure].lengths
    ? D.encoding : MEASURES[state.measure].encoding) === "float32";
  // A value as the page holds it: float32's digits, or the 8-bit value with its error bound.
  function valueText(v, step) {
    if (step === null) return v.toPrecision(6);
    if (step === undefined) return `≈${v.toFixed(4)}`; // norm from 8-bit weights
    return `≈${v.toFixed(4)} (±${(step / 510).toExponential(1)})`;
  }
  const unit = () => (state.measure === "weights" ? "attention" : `${state.measure} ${MEASURES[state.measure].unit}`);
  // A value as a share of its row: weights are shares already, norm's values are divided by
  // their row's sum.
  const rowSum = (row) => row.reduce((s, x) => s + x, 0);
  const share = (v, row) => (state.measure === "weights" ? v : v / rowSum(row));
  const percent = (x) => `${exact() ? "" : "≈"}${(100 * x).toFixed(1)}%`;
  // The patches' share of a row. A weights row sums to 1, so from 8-bit values it is 1 less
  // the few tokens outside the grid: summing 196 rounded values drifts past 100%.
  function patchShare(row) {
    if (state.measure === "weights" && !exact()) {
      return Math.min(1, Math.max(0, 1 - rowSum(row.subarray(0, FIRST))));
    }
    return share(rowSum(row.subarray(FIRST, FIRST + N)), row);
  }

  // ---------- colours ----------
  const LUT = Uint8Array.from({ length: 256 * 3 }, (_, n) => parseInt(D.colours.substr(2 * n, 2), 16));
  // A value's entry of the colour map as matplotlib's picks it: floor(v / top · 256).
  const colourIndex = (v, top) => Math.min(255, Math.max(0, Math.floor((v / top) * 256)));
  const pixels = inflate(PIC.pixels); // (HT, W, 3) uint8, row-major
  // The picture under a row's patch colours, as outputs/figures/pictures.py's blend: each
  // pixel 0.4 · picture + 0.6 · the colour of its patch's value, rounded.
  function paintRow(canvas, picture, row, top) {
    const img = new ImageData(W, HT);
    for (let y = 0; y < HT; y++) {
      for (let x = 0; x < W; x++) {
        const c = colourIndex(row[tokenOf(Math.floor(y / PIC.patch), Math.floor(x / PIC.patch))], top);
        const o = y * W + x;
        for (let k = 0; k < 3; k++) {
          img.data[4 * o + k] = Math.round((1 - ALPHA) * picture[3 * o + k] + ALPHA * LUT[3 * c + k]);
        }
        img.data[4 * o + 3] = 255;
      }
    }
    canvas.getContext("2d").putImageData(img, 0, 0);
  }
  // A removed head (show --ablate) has no pattern: white, hatched light grey, as in the PNGs.
  function paintRemoved(canvas) {
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, W, HT);
    ctx.fillStyle = (D.removed && D.removed.hatch) || "#c8c8c8";
    for (let y = 0; y < HT; y++) for (let x = 0; x < W; x++) if ((x + y) % 6 === 0) ctx.fillRect(x, y, 1, 1);
  }

  // ---------- the section ----------
  const section = el("section", { id: "picture-view", className: "picture-view" });
  const header = document.querySelector("#app > header");
  if (header) header.after(section, el("h2", { className: "picture-below", textContent:
    "Below: the page's views of the same attention, the patches as a sequence of tokens" }));
  else document.body.prepend(section);

  function select(label, id, options, current, onChange) {
    const s = el("select", { id, onchange: (e) => onChange(e.target.value) });
    for (const [value, text] of options) s.append(el("option", { value: String(value), textContent: text }));
    s.value = String(current);
    return el("label", { className: "control" }, `${label} `, s);
  }
  function controls() {
    const redraw = (key, number) => (x) => { state[key] = number ? +x : x; render(); };
    const count = (n) => [...Array(n).keys()];
    return el("div", { className: "controls", id: "picture-controls" },
      select("Layer", "picture-layer", count(D.layers).map((l) => [l, `${D.layer_ids[l]}`]), state.layer, redraw("layer", true)),
      select("Head", "picture-head", count(D.heads).map((h) => [h, `${h}`]), state.head, redraw("head", true)),
      select("Query", "picture-query-select", D.tokens.map((t, i) => [i, `${i}: ${t}`]), state.query, redraw("query", true)),
      Object.keys(MEASURES).length ? select("Measure", "picture-measure", ["weights", ...Object.keys(MEASURES)]
        .map((m) => [m, m]), state.measure, redraw("measure", false)) : "",
      select("Colour scale", "picture-scale", [["layer", "0 to the layer's largest patch value (as the PNGs)"],
        ["head", "each head to its largest"], ["absolute", `absolute (0–${+absolute().toPrecision(3)})`]],
      state.scale, redraw("scale", false)));
  }
  const absolute = () => (state.measure === "weights" ? 1 : MEASURES[state.measure].top);

  const render = serialRender(section, () => view());

  // The view: every head of the layer decoded first, then drawn for the pinned query;
  // hovering a patch draws its row instead (a preview), a click pins it, and a second click
  // on the pinned patch goes back to CLS.
  async function view() {
    const l = state.layer;
    const grids = await Promise.all([...Array(D.heads).keys()].map((h) => head(l, h)));
    const picture = await pixels;
    const scale = Math.max(1, Math.floor(448 / Math.max(W, HT)));
    const main = el("canvas", { id: "picture", width: W, height: HT });
    const cells = el("div", { className: "patch-cells", id: "patch-cells" });
    cells.style.gridTemplateColumns = `repeat(${COLS}, 1fr)`;
    for (let n = 0; n < N; n++) {
      cells.append(el("div", { className: "patch-cell",
        dataset: { row: String(Math.floor(n / COLS)), col: String(n % COLS) } }));
    }
    const frame = el("div", { className: "picture-frame" }, main, cells);
    frame.style.width = `${W * scale}px`;
    frame.style.height = `${HT * scale}px`;
    const side = el("div", { className: "picture-side", id: "picture-side" });
    const panels = grids.map((_, h) => headPanel(h));
    const shown = { l, grids, picture, main, cells, side, panels };
    const cellQuery = (e) => {
      const cell = e.target.closest(".patch-cell");
      return cell ? tokenOf(+cell.dataset.row, +cell.dataset.col) : null;
    };
    // Under the picture: the pinned query's value at the hovered patch, and whose row is drawn.
    const tip = el("p", { className: "picture-tip", id: "picture-tip", role: "status" });
    const column = el("div", {}, frame, tip);
    column.style.width = frame.style.width;
    const untipped = () => tip.replaceChildren("Hover a patch for its value in this row and to draw its own row.");
    frame.addEventListener("pointerover", (e) => {
      const q = cellQuery(e);
      if (q !== null) { drawQuery(shown, q); hoverTip(tip, grids[state.head], q); }
    });
    frame.addEventListener("pointerleave", () => { untipped(); drawQuery(shown, state.query); });
    frame.addEventListener("click", (e) => {
      const q = cellQuery(e);
      if (q !== null) { state.query = q === state.query ? HOME : q; render(); }
    });
    section.replaceChildren(
      el("h2", { textContent: "Over the picture" }),
      controls(),
      el("p", { className: "hint", textContent: `Where a token looks over the picture as the model saw it (${W} × ` +
        `${HT} px, ${ROWS} × ${COLS} patches of ${PIC.patch} px): its row's value on each patch, colour over the ` +
        "picture at 60%. Hover a patch to see its row; click to pin it (click it again for " +
        `${FIRST ? "CLS" : "patch (0, 0): this model has no CLS token"}); click a head below to show it.` }),
      PIC.cut ? el("p", { className: "note", textContent: "The last pixels of the processed picture, which no " +
        "patch covers, are not shown." }) : "",
      state.measure === "weights" ? "" : el("p", { className: "hint", textContent:
        `${state.measure}: ${MEASURES[state.measure].help} (${MEASURES[state.measure].cite}).` }),
      el("div", { className: "picture-row" }, column, side),
      el("h3", { textContent: `Every head of layer ${D.layer_ids[l]}, the same query` }),
      el("div", { className: "picture-heads", id: "picture-heads" }, ...panels.map(([figure]) => figure)),
    );
    untipped();
    drawQuery(shown, state.query);
  }

  // A head's small picture: [figure, canvas, caption]; a click shows that head above.
  function headPanel(h) {
    const canvas = el("canvas", { className: "head-picture", width: W, height: HT });
    canvas.style.width = `${Math.max(96, Math.min(160, W * Math.floor(160 / Math.max(W, HT))))}px`;
    const caption = el("figcaption");
    const figure = el("figure", { className: "picture-head", dataset: { head: String(h) },
      "aria-pressed": String(h === state.head), title: `head ${h}: click to show it above`,
      onclick: () => { state.head = h; render(); } }, canvas, caption);
    return [figure, canvas, caption];
  }

  // Each head's 1 on the colour map, for query rows `rows`.
  function tops(l, rows) {
    const largest = rows.map((row, h) => (isRemoved(l, h) ? 0 : Math.max(...row.subarray(FIRST, FIRST + N))));
    if (state.scale === "head") return largest.map((m) => m || 1);
    const top = state.scale === "absolute" ? absolute() : Math.max(...largest) || 1;
    return largest.map(() => top);
  }

  // Query token q's row: the chosen head's picture, the patches' values, the side panel and
  // every head's small picture.
  function drawQuery({ l, grids, picture, main, cells, side, panels }, q) {
    const rows = grids.map((g) => g.values.subarray(q * T, (q + 1) * T));
    const top = tops(l, rows);
    const h = state.head;
    if (isRemoved(l, h)) paintRemoved(main);
    else paintRow(main, picture, rows[h], top[h]);
    Object.assign(main.dataset, { layer: String(D.layer_ids[l]), head: String(h), query: String(q), top: String(top[h]) });
    [...cells.children].forEach((cell, n) => {
      cell.dataset.value = String(rows[h][FIRST + n]);
      cell.classList.toggle("query", FIRST + n === q);
      cell.classList.toggle("pinned", FIRST + n === state.query);
    });
    side.replaceChildren(...sidePanel(l, q, rows[h], grids[h].step, top[h]));
    panels.forEach(([figure, canvas, caption], k) => {
      figure.setAttribute("aria-pressed", String(k === h));
      if (isRemoved(l, k)) {
        paintRemoved(canvas);
        caption.textContent = `H${k} · removed`;
        return;
      }
      paintRow(canvas, picture, rows[k], top[k]);
      caption.textContent = `H${k} · patches ${percent(patchShare(rows[k]))}`;
    });
  }

  // Beside the picture: whose row, the colour bar, the patches' share and what the tokens
  // outside the grid take by name (a click shows one's own row), and the largest patches.
  function sidePanel(l, q, row, step, top) {
    const h = state.head;
    const name = isPatch(q) ? `patch ${D.tokens[q]}` : D.tokens[q];
    const out = [el("h3", { id: "picture-query", textContent: `Layer ${D.layer_ids[l]}, head ${h}: where ${name} looks` +
      (q === state.query ? "" : " (hovered; click to pin)") })];
    if (isRemoved(l, h)) return [...out, el("p", { className: "note", textContent: D.removed.note })];
    out.push(colourBar(q, top), el("p", { id: "picture-patches", textContent:
      `The ${N} patches hold ${percent(patchShare(row))} of ${state.measure === "weights" ? "" : "the sum of "}` +
      `${D.tokens[q]}'s ${unit()}` +
      (FIRST ? "; the tokens outside the grid:" : "; this model has no token outside the grid.") }));
    const line = (i, pick) => el("tr", { dataset: { token: String(i), value: String(row[i]) } },
      el("td", {}, pick ? el("button", { type: "button", textContent: D.tokens[i], title: `show ${D.tokens[i]}'s own row`,
        onclick: () => { state.query = i; render(); } }) : D.tokens[i]),
      el("td", { textContent: percent(share(row[i], row)) }),
      el("td", { className: "exact", textContent: valueText(row[i], step) }));
    if (FIRST) {
      out.push(el("table", { className: "picture-numbers", id: "picture-outside" },
        ...[...Array(FIRST).keys()].map((i) => line(i, true))));
    }
    const largest = [...Array(N).keys()].map((n) => FIRST + n).sort((x, y) => row[y] - row[x]).slice(0, 5);
    out.push(el("p", { textContent: "Its largest patches:" }),
      el("table", { className: "picture-numbers", id: "picture-top" }, ...largest.map((j) => line(j, false))));
    if (q !== HOME && q === state.query) {
      out.push(el("button", { type: "button", id: "picture-home", textContent: `back to ${D.tokens[HOME]}`,
        onclick: () => { state.query = HOME; render(); } }));
    }
    return out;
  }

  // The colour map from 0 to the scale's top, and what a colour says.
  function colourBar(q, top) {
    const bar = el("canvas", { className: "legend-bar", width: 256, height: 12 });
    const ctx = bar.getContext("2d");
    for (let x = 0; x < 256; x++) {
      ctx.fillStyle = `rgb(${LUT[3 * x]},${LUT[3 * x + 1]},${LUT[3 * x + 2]})`;
      ctx.fillRect(x, 0, 1, 12);
    }
    const what = state.measure === "weights" ? `share of ${D.tokens[q]}'s attention a patch holds` : unit();
    return el("div", { className: "legend", id: "picture-legend" }, el("span", { textContent: `${what}: 0` }), bar,
      el("span", { textContent: top.toPrecision(3) + (state.scale === "head" ? " (this head's largest)" : "") }));
  }

  // Over a hovered patch: the pinned query's value there, and whose row is drawn now.
  function hoverTip(tip, grid, q) {
    const v = grid.values[state.query * T + q];
    tip.replaceChildren(el("span", { className: "weight", textContent:
      `${D.tokens[state.query]} → ${D.tokens[q]}: ${valueText(v, grid.step)}` }),
    q === state.query ? " (its own row is drawn)" : ` · drawn: ${D.tokens[q]}'s row (click to pin it)`);
  }

  return render();
}

{
  const data = JSON.parse(document.getElementById("attnviz-data").textContent);
  if (data.picture) drawPicture(data).then(() => { document.body.dataset.picture = "ready"; });
}
