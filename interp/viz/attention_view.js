function (id) {
  "use strict";
  const root = document.getElementById(id);
  if (!root || root.dataset.ready) return;
  const D = JSON.parse(document.getElementById(id + "-data").textContent);
  const msg = root.querySelector(".av-msg");
  if (msg) msg.remove();
  const T = D.tokens.length;

  function bytes(s) {  // base64 -> a fresh ArrayBuffer (offset 0, so typed views are aligned)
    const bin = atob(s), out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out.buffer;
  }
  const decoded = {};
  function layerData(li) {  // decoded on first use: the page never holds every layer's arrays
    if (decoded[li]) return decoded[li];
    const L = D.layers[li];
    const counts = new Uint8Array(bytes(L.counts));
    const keys = D.key_bytes === 4 ? new Uint32Array(bytes(L.keys)) : new Uint16Array(bytes(L.keys));
    const weights = new Uint8Array(bytes(L.weights));
    const start = new Uint32Array(counts.length + 1);  // start[h * T + q]: first kept key of (head, query)
    for (let i = 0; i < counts.length; i++) start[i + 1] = start[i] + counts[i];
    return (decoded[li] = {counts, keys, weights, start});
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  const bar = el("div", "av-bar");
  if (D.title) bar.appendChild(el("span", "av-title", D.title));
  bar.appendChild(el("span", null, "layer"));
  const layerSel = el("select", "av-layer");
  D.layers.forEach((L, i) => { const o = el("option", null, String(L.layer)); o.value = String(i); layerSel.appendChild(o); });
  bar.appendChild(layerSel);
  bar.appendChild(el("span", null, "head"));
  const headBox = el("div", "av-heads");
  bar.appendChild(headBox);
  root.appendChild(bar);
  const info = el("div", "av-info", "hover a token: the tokens it attends to are coloured (click to pin)");
  root.appendChild(info);
  root.appendChild(el("div", "av-legend",
    "colour: opacity = sqrt(weight); shown: the " + D.top_k + " heaviest keys per query with weight \u2265 " +
    D.min_weight + ". Boxed heads share one K/V head."));
  const box = el("div", "av-tokens");
  const spans = new Array(T);
  const frag = document.createDocumentFragment();
  D.tokens.forEach((t, i) => {
    const s = el("span", "av-tok", t.replace(/\n/g, "\u21b5"));
    s.dataset.i = String(i);
    s.title = i + ": " + JSON.stringify(t);
    spans[i] = s;
    frag.appendChild(s);
    if (t.indexOf("\n") >= 0) frag.appendChild(document.createElement("br"));
  });
  box.appendChild(frag);
  root.appendChild(box);

  let li = 0, head = 0, shown = [], query = -1, pinned = -1;
  function buildHeads() {
    headBox.textContent = "";
    const L = D.layers[li];
    let group = null, last = null;
    for (let h = 0; h < L.heads; h++) {
      const g = L.kv_map[h];
      const grouped = L.kv_map.length > 0 && new Set(L.kv_map).size < L.heads;
      if (!group || g !== last) {
        group = el("span", grouped ? "av-group" : "");
        group.dataset.kv = String(g);
        if (grouped) group.appendChild(el("span", "av-group-label", "kv" + g));
        headBox.appendChild(group);
        last = g;
      }
      const b = el("button", "av-head" + (h === head ? " av-on" : ""), String(h));
      b.dataset.h = String(h);
      b.title = "head " + h + (grouped ? " (K/V head " + g + ")" : "");
      group.appendChild(b);
    }
  }
  function clear() {
    for (const i of shown) { spans[i].style.background = ""; spans[i].classList.remove("av-hl"); delete spans[i].dataset.w; }
    shown = [];
    if (query >= 0) spans[query].classList.remove("av-q");
    query = -1;
  }
  function show(q) {
    clear();
    const L = D.layers[li], d = layerData(li), row = head * T + q;
    const a = d.start[row], n = d.counts[row], parts = [];
    for (let j = a; j < a + n; j++) {
      const k = d.keys[j], w = d.weights[j] / 255;
      const s = spans[k];
      s.style.background = "rgba(33, 102, 172, " + Math.sqrt(w).toFixed(3) + ")";
      s.classList.add("av-hl");
      s.dataset.w = w.toFixed(4);
      shown.push(k);
      if (parts.length < 6) parts.push(JSON.stringify(D.tokens[k]) + "@" + k + " " + w.toFixed(2));
    }
    query = q;
    spans[q].classList.add("av-q");
    const grouped = new Set(L.kv_map).size < L.heads;
    info.textContent = "L" + L.layer + " H" + head + (grouped ? " (K/V head " + L.kv_map[head] + ")" : "") +
      " \u00b7 query " + q + " " + JSON.stringify(D.tokens[q]) + " attends to: " + parts.join(", ") +
      (n > parts.length ? ", \u2026" : "");
  }
  function refresh() { const q = pinned >= 0 ? pinned : query; if (q >= 0) show(q); }

  layerSel.addEventListener("change", () => {
    li = Number(layerSel.value);
    head = Math.min(head, D.layers[li].heads - 1);
    buildHeads();
    refresh();
  });
  headBox.addEventListener("click", (e) => {
    const b = e.target.closest("button.av-head");
    if (!b) return;
    head = Number(b.dataset.h);
    headBox.querySelectorAll("button.av-head").forEach((x) => x.classList.toggle("av-on", x === b));
    refresh();
  });
  box.addEventListener("mouseover", (e) => {
    const s = e.target.closest(".av-tok");
    if (s && pinned < 0) show(Number(s.dataset.i));
  });
  box.addEventListener("click", (e) => {
    const s = e.target.closest(".av-tok");
    if (!s) return;
    const i = Number(s.dataset.i);
    if (pinned >= 0) spans[pinned].classList.remove("av-pinned");
    pinned = pinned === i ? -1 : i;
    if (pinned >= 0) { spans[pinned].classList.add("av-pinned"); show(pinned); }
  });
  buildHeads();
  root.dataset.ready = "1";
}
