// attnviz page, a vision-language model's vision tower over its picture (its page only): for
// the tower layer chosen, every head's row over the tower's tokens drawn over the picture side
// by side, each patch's value on its cell (page.py's tower_entry: the cells' edges as
// Layout.edges puts them), on one colour scale for the layer (0 to its largest value, as
// tower-layer-L.png): CLS's row where the tower has a CLS token, else what each patch
// receives, the mean over its queries; each head captioned with its role and mean attention
// distance. Drawn in a section of its own, below the answer's (answer.js) where there is one.
"use strict";

function drawTower(D) {
  const V = D.tower;
  const [W, HT] = V.size;
  const { inflate, floats, el, overlay, serialRender } = attnvizBlobs;
  const over = overlay(V, D.colours, V.tokens); // each patch's value on its cell (blobs.js)
  const pixels = inflate(V.pixels); // (HT, W, 3) uint8, row-major
  const layers = new Map(); // a layer's rows, (heads, tokens) float32, decoded when first shown
  function layer(l) {
    if (!layers.has(l)) layers.set(l, inflate(V.maps[l]).then((bytes) => floats(bytes.slice())));
    return layers.get(l);
  }
  const state = { layer: V.layers - 1 }; // the last layer first, as the docs' figure

  const section = el("section", { id: "tower-view", className: "picture-view" });
  const answer = document.getElementById("answer-view");
  const header = document.querySelector("#app > header");
  if (answer) answer.after(section);
  else if (header) header.after(section, el("h2", { className: "picture-below", textContent:
    "Below: the page's views of the language model's attention" }));
  else document.body.prepend(section);

  const render = serialRender(section, () => view());

  function choose() {
    const s = el("select", { id: "tower-layer", onchange: (e) => { state.layer = +e.target.value; render(); } });
    for (let l = 0; l < V.layers; l++) s.append(el("option", { value: String(l), textContent: `${l}` }));
    s.value = String(state.layer);
    return el("label", { className: "control" }, "Tower layer ", s);
  }

  async function view() {
    const l = state.layer;
    const [maps, picture] = await Promise.all([layer(l), pixels]);
    const n = V.tokens;
    const values = V.heads[l].map((_, h) => over.painted(maps.subarray(h * n, (h + 1) * n)));
    const top = over.top(values);
    const panels = values.map((v, h) => {
      const canvas = over.canvas({ className: "head-picture", dataset: { head: String(h) } });
      over.paint(canvas, picture, v, top);
      const said = V.heads[l][h];
      const caption = el("figcaption", {}, `H${h} · ${said.role} · ${said.distance.toFixed(0)} px`);
      if (V.cls) caption.append(el("br"), `CLS on the patches ${(100 * said.on_patches).toFixed(0)}%`);
      return el("figure", { className: "picture-head" }, canvas, caption);
    });
    const grids = V.parts.map((p) => `${p.grid[0]} × ${p.grid[1]}`).join(" + ");
    const what = V.cls ? "where its CLS token looks" : "what each patch receives, the mean over its queries";
    section.replaceChildren(
      el("h2", { textContent: "The vision tower's heads over the picture" }),
      el("p", { className: "hint", textContent: `Each head of the tower layer chosen: ${what}, each patch's ` +
        `value over its cell, colour over the picture at 60%, one scale for the layer's heads. ${V.name}, ` +
        `${V.given[0]} × ${V.given[1]} px, drawn at ${W} × ${HT}: the tower's patches (${grids}), ${V.patch} px ` +
        `a side as it read them. Roles and mean attention distances as a vision transformer's ` +
        `(uniform attention over the grid would reach ${V.uniform.toFixed(1)} px)` +
        (over.faded ? "; the parts of the picture no patch stands for are faded." : ".") }),
      el("div", { className: "controls" }, choose()),
      over.legend(top, V.cls ? "CLS's attention on a patch" : "mean attention a patch receives", "tower-legend"),
      el("div", { className: "picture-heads", id: "tower-heads", dataset: { top: String(top) } }, ...panels),
    );
  }

  return render();
}

{
  const data = JSON.parse(document.getElementById("attnviz-data").textContent);
  if (data.tower) drawTower(data).then(() => { document.body.dataset.tower = "ready"; });
}
