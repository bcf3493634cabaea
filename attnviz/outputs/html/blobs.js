// attnviz page: what the views over a picture share (picture.js, answer.js, tower.js): the
// heads' blobs (page.py's _head_blob) decoded, the one element builder, a row of values
// (one a token) drawn over a layout's picture (answer.js, tower.js), and a view's render. Offline:
// DecompressionStream inflates them in the browser.
"use strict";

const attnvizBlobs = (() => {
  const bytesOf = (b64) => Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  async function inflate(b64) {
    const stream = new Blob([bytesOf(b64)]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }
  const floats = (bytes) => new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
  // One blob: {values (T × T), step}: float32 as stored (step null), or uint8 steps of the
  // head's max (page.py's _head_blob), step that max.
  async function decode(blob, encoding) {
    const bytes = await inflate(blob);
    if (encoding === "float32") return { values: floats(bytes.slice()), step: null };
    const max = floats(bytes.slice(0, 4))[0];
    const values = new Float32Array(bytes.length - 4);
    for (let n = 0; n < values.length; n++) values[n] = (bytes[4 + n] * max) / 255;
    return { values, step: max };
  }
  // An element with its properties, listeners ("onclick"), dataset and attributes, and children.
  const el = (tag, props = {}, ...children) => {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props)) {
      if (k === "dataset") Object.assign(node.dataset, v);
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else if (k === "className" || k === "textContent" || k === "title") node[k] = v;
      else node.setAttribute(k, v);
    }
    node.append(...children);
    return node;
  };
  // Rows of values (one a token of `n`) over a layout's picture, as outputs/figures/pictures.py's
  // over_layout draws them: `A` is page.py's over_picture entry (the picture at the page's
  // size and each part's tokens and the edges of their cells), `colours` the page's table.
  function overlay(A, colours, n) {
    const [W, HT] = A.size;
    const ALPHA = 0.6; // the colours' share over the picture, as in the PNGs
    // A row on the picture's pixels: each cell's value over its edges, parts that overlap
    // added (Layout.painted).
    function painted(row) {
      const out = new Float64Array(W * HT);
      for (const part of A.parts) {
        const cols = part.grid[1];
        for (let r = 0; r < part.grid[0]; r++) {
          for (let c = 0; c < cols; c++) {
            const v = row[part.tokens[r * cols + c]];
            for (let y = part.ys[r]; y < part.ys[r + 1]; y++) {
              for (let x = part.xs[c]; x < part.xs[c + 1]; x++) out[y * W + x] += v;
            }
          }
        }
      }
      return out;
    }
    const seen = painted(new Float64Array(n).fill(1)); // 0: a pixel no cell covers (a crop's margin)
    const LUT = Uint8Array.from({ length: 256 * 3 }, (_, k) => parseInt(colours.substr(2 * k, 2), 16));
    const colourIndex = (v, top) => Math.min(255, Math.max(0, Math.floor((v / top) * 256)));
    // The scale of painted rows drawn together: their largest value on a seen pixel (1: none).
    function top(values) {
      let most = 0;
      for (const v of values) for (let o = 0; o < v.length; o++) if (seen[o] > 0 && v[o] > most) most = v[o];
      return most || 1;
    }
    // The picture under each pixel's colour, as pictures.py's blend_values: a pixel no cell
    // covers under white.
    function paint(canvas, picture, values, top) {
      const img = new ImageData(W, HT);
      for (let o = 0; o < W * HT; o++) {
        const c = colourIndex(values[o], top);
        for (let k = 0; k < 3; k++) {
          const over = seen[o] > 0 ? LUT[3 * c + k] : 255;
          img.data[4 * o + k] = Math.round((1 - ALPHA) * picture[3 * o + k] + ALPHA * over);
        }
        img.data[4 * o + 3] = 255;
      }
      canvas.getContext("2d").putImageData(img, 0, 0);
    }
    // A panel's canvas: the picture at its own size, shown at least 96 and at most 224 px wide.
    function canvas(props) {
      const node = el("canvas", { ...props, width: W, height: HT });
      node.style.width = `${Math.max(96, Math.min(224, W))}px`; // CSSOM: allowed by the CSP
      return node;
    }
    function legend(top, what, id) {
      const bar = el("canvas", { className: "legend-bar", width: 256, height: 12 });
      const ctx = bar.getContext("2d");
      for (let x = 0; x < 256; x++) {
        ctx.fillStyle = `rgb(${LUT[3 * x]},${LUT[3 * x + 1]},${LUT[3 * x + 2]})`;
        ctx.fillRect(x, 0, 1, 12);
      }
      return el("div", { className: "legend", id },
        el("span", { textContent: `${what}: 0` }), bar, el("span", { textContent: top.toPrecision(3) }));
    }
    return { painted, seen, faded: seen.some((v) => v === 0), top, paint, canvas, legend };
  }
  // A view's render function: renders run one at a time, in order (each waits for the last);
  // the section counts them (the page tests wait on it) and shows an error in the view's place.
  function serialRender(section, view) {
    let rendering = Promise.resolve();
    return function render() {
      rendering = rendering.then(async () => {
        await view();
        section.dataset.renders = String(+(section.dataset.renders || 0) + 1);
      }).catch((err) => {
        section.replaceChildren(el("p", { className: "error", textContent: String(err) }));
        throw err;
      });
      return rendering;
    };
  }

  return { inflate, floats, decode, el, overlay, serialRender };
})();
