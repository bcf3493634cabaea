// attnviz page: the heads' blobs (page.py's _head_blob) decoded, for the views over a picture
// (picture.js, answer.js), and the one element builder both use. Offline: DecompressionStream
// inflates them in the browser.
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
  return { inflate, floats, decode, el };
})();
