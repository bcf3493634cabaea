// attnviz serve's page: a form above page.js's views. A text goes to the server that served
// this page (POST /api/page, the only request it makes), which answers with the same data an
// offline page embeds; page.js's draw() shows it. The URL's hash carries the text and the view
// (#text=…&view=matrix&layer=3), so a view can be bookmarked and shared; Back and Forward go
// through the texts asked. The session's texts are listed on the side.
"use strict";

{
  const S = JSON.parse(document.getElementById("attnviz-data").textContent).live;
  const FLAGS = [["words", "words", "merge word pieces into words"],
    ["hide_special", "hide special", "drop [CLS]/[SEP]/BOS and renormalise each row"],
    ["truncate", "truncate", `cut a text past the model's ${S.model.max_tokens} tokens`]];
  // What the server reads (a new request when one changes) and what only the view shows.
  const ASKED = ["text", "pair", "words", "hide_special", "truncate"];
  const VIEWED = ["measure", "view", "layer", "head", "query"];

  const make = (tag, props = {}, ...children) => {
    const node = Object.assign(document.createElement(tag), props);
    node.append(...children);
    return node;
  };
  const text = make("input", { id: "text", type: "text", name: "text", autofocus: true,
    placeholder: "Type a sentence and press Enter", autocomplete: "off" });
  const pair = make("input", { id: "pair", type: "text", name: "pair", autocomplete: "off",
    placeholder: "a second sentence (optional): the model reads the pair" });
  const boxes = Object.fromEntries(FLAGS.map(([key]) => [key, make("input", { type: "checkbox", id: key })]));
  const measure = make("select", { id: "ask-measure" },
    ...Object.entries(S.measures).map(([m, help]) => make("option", { value: m, textContent: m, title: help })));
  const status = make("p", { id: "status", role: "status", className: "hint" });
  const form = make("form", { id: "ask" },
    make("div", { className: "ask-row" }, text, make("button", { type: "submit", textContent: "Show" })),
    ...(S.model.causal ? [] : [make("div", { className: "ask-row" }, pair)]),
    make("div", { className: "ask-row options" },
      ...FLAGS.map(([key, label, help]) => make("label", { title: help }, boxes[key], ` ${label}`)),
      make("label", {}, "measure ", measure)),
    status);
  const texts = make("ol");
  const aside = make("aside", { id: "history" }, make("h2", { textContent: "This session" }), texts);
  const app = make("div", { id: "app" }, make("p", { className: "hint", textContent:
    `${S.model.name} (${S.model.architecture}, ${S.model.n_layers} layers × ${S.model.n_heads} heads) ` +
    "is loaded: type a sentence above and press Enter." }));
  document.body.append(make("div", { id: "live" },
    make("header", {}, make("h1", { textContent: `attnviz serve · ${S.model.name}` }), form),
    make("div", { className: "live-body" }, app, aside)));

  // The hash's parameters (URLSearchParams), and the form's question as parameters.
  const params = () => new URLSearchParams(location.hash.slice(1));
  const key = (p) => ASKED.map((k) => p.get(k) || "").join("\u0000");
  // The view, layer and head stay as they are for a new text; the query (a position) does not.
  function fromForm(viewOf) {
    const p = new URLSearchParams();
    p.set("text", text.value);
    if (pair.value.trim() && !S.model.causal) p.set("pair", pair.value);
    for (const [k] of FLAGS) if (boxes[k].checked) p.set(k, "1");
    if (measure.value !== "weights") p.set("measure", measure.value);
    for (const k of VIEWED.slice(1)) if (viewOf.has(k)) p.set(k, viewOf.get(k));
    if (key(p) !== key(viewOf)) p.delete("query");
    return p;
  }
  function toForm(p) {
    text.value = p.get("text") || "";
    pair.value = p.get("pair") || "";
    for (const [k] of FLAGS) boxes[k].checked = p.get(k) === "1";
    measure.value = p.get("measure") || "weights";
  }

  let shown = null; // {key, data}: the text on the page
  let asked = 0; // each request's number: an answer to an older one is dropped
  async function load() {
    const p = params();
    toForm(p);
    if (!p.get("text")) return;
    const number = ++asked;
    const initial = { view: p.get("view"), measure: p.get("measure") || "weights" };
    for (const k of ["layer", "head", "query"]) if (p.has(k)) initial[k] = +p.get(k);
    if (!shown || shown.key !== key(p)) {
      status.textContent = "reading…";
      status.className = "hint";
      const body = { text: p.get("text"), pair: p.get("pair") || null, measure: initial.measure };
      for (const [k] of FLAGS) body[k] = p.get(k) === "1";
      const started = performance.now();
      let answer;
      try {
        const response = await fetch("/api/page", { method: "POST",
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
      shown = { key: key(p), data: answer };
      status.textContent = `${answer.tokens.length} ${answer.unit}s in ${Math.round(performance.now() - started)} ms`;
      remember(p);
    }
    await draw(shown.data, initial, keepInHash);
    document.body.dataset.text = shown.data.text;
  }

  // The view's state into the hash, without a history entry (Back goes to the previous text).
  function keepInHash(state) {
    const p = params();
    if (state.measure === "weights") p.delete("measure");
    else p.set("measure", state.measure);
    for (const k of VIEWED.slice(1)) p.set(k, String(state[k]));
    measure.value = state.measure;
    history.replaceState(null, "", `#${p}`);
  }

  const seen = new Set();
  function remember(p) {
    const entry = key(p);
    if (seen.has(entry)) return;
    seen.add(entry);
    const q = new URLSearchParams();
    for (const k of ASKED) if (p.get(k)) q.set(k, p.get(k));
    const label = p.get("pair") ? `${p.get("text")} | ${p.get("pair")}` : p.get("text");
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
