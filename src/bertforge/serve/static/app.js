// bertforge explorer: asks the server's JSON API and draws what one or two models make of a
// text. Hand-written, no dependencies; everything it loads comes from the same server.
"use strict";

const CAP = 64; // most tokens shown per text (attention/attribution computed on these)
const $ = (id) => document.getElementById(id);
const state = { info: null, css: "", runs: {}, layer: 0, head: "avg", view: "head", focus: null };

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c != null) node.append(c);
  return node;
}

async function api(path, body) {
  const response = await fetch(path, {
    method: body === undefined ? "GET" : "POST",
    headers: { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let answer;
  try { answer = await response.json(); } catch { answer = null; }
  if (!response.ok) {
    const message = answer && answer.error ? answer.error : `HTTP ${response.status}`;
    throw new Error(`${path}: ${message}`);
  }
  return answer;
}

function modelInfo(name) {
  return state.info.models.find((m) => m.name === name);
}

// ---- start-up -----------------------------------------------------------------------------
async function start() {
  try {
    state.info = await api("/info");
    state.css = await (await fetch("/static/style.css")).text();
  } catch (err) {
    $("results").append(el("div", { class: "error", role: "alert", text: String(err.message) }));
    return;
  }
  const names = state.info.models.map((m) => m.name);
  for (const name of names) {
    const m = modelInfo(name);
    const label = `${name} (${m.kind}, ${(m.parameters / 1e6).toFixed(2)}M)`;
    $("model-a").append(el("option", { value: name, text: label }));
    $("model-b").append(el("option", { value: name, text: label }));
  }
  if (names.length > 1) $("model-b").value = names[1];
  const cap = Math.min(CAP, state.info.limits.max_attention_tokens);
  $("cap").textContent = cap;
  $("run").addEventListener("click", run);
  $("text").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); run(); }
  });
  $("view").addEventListener("change", () => { state.view = $("view").value; redrawAttention(); });
  $("layer").addEventListener("change", () => { state.layer = +$("layer").value; redrawAttention(); });
  $("head").addEventListener("change", () => { state.head = $("head").value; redrawAttention(); });
  $("save-html").addEventListener("click", () => save("html"));
  $("save-png").addEventListener("click", () => save("png"));
  run();
}

function tokenCap() {
  return Math.min(CAP, state.info.limits.max_attention_tokens);
}

function selectedModels() {
  const names = [$("model-a").value];
  if ($("model-b").value && $("model-b").value !== names[0]) names.push($("model-b").value);
  return names;
}

// ---- running a text through the models ------------------------------------------------------
async function run() {
  const text = $("text").value;
  const topK = Math.max(1, Math.min(20, +$("top-k").value || 5));
  const names = selectedModels();
  $("run").disabled = true;
  $("status").textContent = "asking " + names.join(" and ") + " …";
  const results = $("results");
  results.replaceChildren();
  state.runs = {};
  const panels = names.map((name) => {
    const panel = el("article", { class: "panel", "data-model": name, "aria-label": name });
    results.append(panel);
    return panel;
  });
  await Promise.all(names.map((name, i) => runModel(name, text, topK, panels[i])));
  setLayerHeadChoices();
  redrawAttention();
  $("run").disabled = false;
  $("status").textContent = "done";
}

async function runModel(name, text, topK, panel) {
  const info = modelInfo(name);
  const errors = el("div", { class: "error", role: "alert" });
  const meta = `${info.kind} · ${info.config.num_hidden_layers} layers × ${info.config.num_attention_heads} heads · hidden ${info.config.hidden_size} · ${info.parameters.toLocaleString()} parameters`;
  panel.append(el("h2", { text: name }), el("div", { class: "meta", text: meta }), errors);
  const fail = (err) => errors.append(el("div", { text: err.message }));
  const r = (state.runs[name] = { name, text, info, panel });
  const cap = Math.min(tokenCap(), info.config.max_position_embeddings);
  try {
    [r.tokens] = await api("/tokenize", { inputs: [text], model: name });
  } catch (err) {
    fail(err);
    return;
  }
  const tokenBox = el("div", { class: "tokens", role: "group", "aria-label": "WordPieces" });
  panel.append(el("h3", { text: "WordPieces (click one to mask its word)" }), tokenBox);
  const jobs = [];
  const outputs = el("div");
  panel.append(outputs);
  if (info.kind === "masked-lm") {
    if (!text.includes("[MASK]")) {
      outputs.append(el("p", { class: "hint", text: "No [MASK] in the text: click a token to mask it." }));
    } else {
      jobs.push(api("/fill-mask", { inputs: [text], model: name, top_k: topK })
        .then(([answer]) => drawFillMask(outputs, answer)).catch(fail));
    }
  } else if (info.kind === "classifier") {
    jobs.push(api("/attribute", { inputs: text, model: name, steps: 32, max_tokens: cap })
      .then((answer) => { r.attribution = answer; drawPrediction(outputs, answer); })
      .catch(fail));
  } else {
    outputs.append(el("p", { class: "hint", text: "An encoder without a head: tokens and attention only (its vectors: POST /embed)." }));
  }
  const attentionBox = el("div", { class: "attention" });
  panel.append(el("h3", { text: "Attention" }), attentionBox);
  r.attentionBox = attentionBox;
  jobs.push(api("/attention", { inputs: text, model: name, max_tokens: cap })
    .then((answer) => { r.attention = answer; }).catch(fail));
  await Promise.all(jobs);
  drawTokens(tokenBox, r);
}

// ---- tokens ---------------------------------------------------------------------------------
function wordSpan(tokens, i) {
  // the characters of the whole word holding WordPiece i (its ## continuations joined)
  let a = i, b = i;
  while (a > 1 && tokens[a].text.startsWith("##")) a -= 1;
  while (b + 1 < tokens.length - 1 && tokens[b + 1].text.startsWith("##")) b += 1;
  return [tokens[a].start, tokens[b].stop];
}

function maskWord(r, i) {
  const [start, stop] = wordSpan(r.tokens, i);
  const text = r.text;
  $("text").value = text.slice(0, start) + "[MASK]" + text.slice(stop);
  run().then(() => { $("status").textContent = `masked “${text.slice(start, stop)}”`; });
}

function drawTokens(box, r) {
  const tokens = r.tokens;
  const attr = r.attribution ? r.attribution.attributions : null;
  const scale = attr ? Math.max(...attr.map(Math.abs)) : 0;
  tokens.slice(0, tokenCap()).forEach((t, i) => {
    const mask = t.text === "[MASK]";
    const cls = "tok" + (t.special ? " special" : "") + (mask ? " mask" : "");
    let node;
    if (t.special) {
      node = el("span", { class: cls, text: t.text });
    } else {
      node = el("button", {
        class: cls, type: "button", text: t.text,
        title: `id ${t.id}, characters ${t.start}–${t.stop}` + (attr && i < attr.length ? `, attribution ${attr[i].toFixed(4)}` : ""),
        "aria-label": `mask the word of ${t.text}`,
        onclick: () => maskWord(r, i),
      });
    }
    if (attr && i < attr.length) {
      const [r, g, b] = (attr[i] >= 0 ? "214,70,60" : "40,110,200").split(",");
      const a = scale ? (Math.min(1, Math.abs(attr[i]) / scale) * 0.75).toFixed(3) : 0;
      node.style.background = `rgba(${r},${g},${b},${a})`;
    }
    box.append(node);
  });
  if (tokens.length > tokenCap()) {
    box.append(el("span", { class: "more", text: `… ${tokens.length - tokenCap()} more tokens not shown (cap ${tokenCap()})` }));
  }
}

// ---- fill-mask and classification -------------------------------------------------------------
function bars(rows) {
  const box = el("div");
  rows.forEach(([name, value], k) => {
    box.append(el("div", { class: "bar-row" + (k === 0 ? " top" : "") },
      el("span", { class: "name", text: name, title: name }),
      el("div", {}, el("div", { class: "bar", style: `width:${(value * 100).toFixed(1)}%` })),
      el("span", { class: "value", text: (value * 100).toFixed(1) + "%" })));
  });
  return box;
}

function drawFillMask(box, answer) {
  box.append(el("h3", { text: "Predictions" }),
    el("p", { class: "prediction" }, "Filled: ", el("strong", { text: answer.filled })));
  answer.masks.forEach((candidates, m) => {
    box.append(el("div", { class: "mask-block" },
      el("div", { class: "label", text: `[MASK] ${m + 1} of ${answer.masks.length}` }),
      bars(candidates.map((c) => [c.token, c.score]))));
  });
}

function drawPrediction(box, answer) {
  box.append(el("h3", { text: "Prediction" }));
  if ("value" in answer) {
    box.append(el("p", { class: "prediction" }, "Value: ", el("strong", { text: answer.value.toFixed(4) })));
  } else {
    const rows = Object.entries(answer.scores).sort((a, b) => b[1] - a[1]);
    box.append(el("p", { class: "prediction" }, "Label: ", el("strong", { text: answer.label })), bars(rows));
  }
  box.append(el("p", { class: "legend" },
    el("span", { class: "sw", style: "background:rgba(214,70,60,.7)" }), " pushes towards ",
    el("strong", { text: answer.target || "the value" }), "  ",
    el("span", { class: "sw", style: "background:rgba(40,110,200,.7)" }), " pushes away",
    ` (integrated gradients, ${answer.steps} steps, completeness gap ${answer.delta.toExponential(1)})`));
}

// ---- attention --------------------------------------------------------------------------------
function setLayerHeadChoices() {
  let layers = 0, heads = 0;
  for (const r of Object.values(state.runs)) {
    if (r.attention) { layers = Math.max(layers, r.attention.layers); heads = Math.max(heads, r.attention.heads); }
  }
  const layer = $("layer"), head = $("head");
  const keepLayer = Math.min(state.layer, Math.max(0, layers - 1));
  layer.replaceChildren(...Array.from({ length: layers }, (_, i) => el("option", { value: i, text: String(i + 1) })));
  layer.value = keepLayer; state.layer = keepLayer;
  head.replaceChildren(el("option", { value: "avg", text: "average of heads" }),
    ...Array.from({ length: heads }, (_, i) => el("option", { value: i, text: String(i + 1) })));
  if (state.head !== "avg" && +state.head >= heads) state.head = "avg";
  head.value = state.head;
}

function headMatrix(attention, layer, head) {
  const L = Math.min(layer, attention.layers - 1);
  const maps = attention.attentions[L];
  if (head === "avg") {
    const T = maps[0].length;
    return Array.from({ length: T }, (_, i) => Array.from({ length: T }, (_, j) => maps.reduce((s, h) => s + h[i][j], 0) / maps.length));
  }
  return maps[Math.min(+head, maps.length - 1)];
}

function redrawAttention() {
  $("layer").disabled = $("head").disabled = state.view !== "head";
  for (const r of Object.values(state.runs)) {
    if (!r.attentionBox) continue;
    r.attentionBox.replaceChildren();
    if (!r.attention) continue;
    if (r.attention.truncated) {
      r.attentionBox.append(el("p", { class: "hint", text: `computed on the first ${r.attention.tokens.length} tokens` }));
    }
    if (state.view === "head") drawHeadView(r);
    else drawModelView(r);
  }
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function drawHeadView(r) {
  const tokens = r.attention.tokens;
  const layer = Math.min(state.layer, r.attention.layers - 1);
  const head = state.head === "avg" ? "avg" : Math.min(+state.head, r.attention.heads - 1);
  const weights = headMatrix(r.attention, layer, head);
  const top = Math.max(1e-6, ...weights.map((row) => Math.max(...row)));
  const rowH = 18, width = 420, left = 130, right = width - 130;
  const height = tokens.length * rowH + 10;
  const box = el("div", { class: "headview" });
  const label = head === "avg" ? "average of heads" : `head ${head + 1}`;
  const clamped = layer !== state.layer || (head !== "avg" && head !== +state.head);
  const note = clamped ? ` (this model has ${r.attention.layers} layers × ${r.attention.heads} heads)` : "";
  box.append(el("div", { class: "meta", text: `layer ${layer + 1}, ${label}${note}: line opacity grows with the attention w from a token (left) to a token (right) as √w (largest here ${top.toFixed(2)}); hover or focus a token on the left to see its row alone` }));
  const picture = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": `attention of ${r.name}, layer ${layer + 1}, ${label}` });
  const lines = svg("g", {});
  const drawLines = (only) => {
    lines.replaceChildren();
    tokens.forEach((_, i) => {
      if (only != null && i !== only) return;
      weights[i].forEach((w, j) => {
        if (w < 0.01) return;
        lines.append(svg("line", { x1: left + 4, y1: 14 + i * rowH - 4, x2: right - 4, y2: 14 + j * rowH - 4, stroke: "#2f5fd0", "stroke-width": 1.5, "stroke-opacity": (0.8 * Math.sqrt(w)).toFixed(3) }));
      });
    });
  };
  drawLines(null);
  picture.append(lines);
  tokens.forEach((t, i) => {
    const a = svg("text", { x: left - 6, y: 14 + i * rowH, "text-anchor": "end", tabindex: 0 });
    a.textContent = t;
    const b = svg("text", { x: right + 6, y: 14 + i * rowH });
    b.textContent = t;
    const show = () => { a.classList.add("active"); drawLines(i); };
    const hide = () => { a.classList.remove("active"); drawLines(null); };
    a.addEventListener("mouseenter", show); a.addEventListener("focus", show);
    a.addEventListener("mouseleave", hide); a.addEventListener("blur", hide);
    picture.append(a, b);
  });
  box.append(picture);
  r.attentionBox.append(box);
}

function drawModelView(r) {
  const { layers, heads, attentions, tokens } = r.attention;
  const T = tokens.length;
  const grid = el("div", { class: "modelview", role: "group", "aria-label": "layers × heads" });
  grid.style.gridTemplateColumns = `3.5em repeat(${heads}, 66px)`;
  grid.append(el("span", { class: "axis", text: "layer" }));
  for (let h = 0; h < heads; h++) grid.append(el("span", { class: "axis", text: `head ${h + 1}` }));
  for (let l = 0; l < layers; l++) {
    grid.append(el("span", { class: "axis", text: String(l + 1) }));
    for (let h = 0; h < heads; h++) {
      const canvas = el("canvas", { width: T, height: T });
      const ctx = canvas.getContext("2d");
      const image = ctx.createImageData(T, T);
      const m = attentions[l][h];
      const top = Math.max(1e-6, ...m.map((row) => Math.max(...row)));
      for (let i = 0; i < T; i++) for (let j = 0; j < T; j++) {
        const v = Math.min(1, m[i][j] / top);
        const o = 4 * (i * T + j);
        image.data[o] = 255 - v * 208; image.data[o + 1] = 255 - v * 160; image.data[o + 2] = 255 - v * 47; image.data[o + 3] = 255;
      }
      ctx.putImageData(image, 0, 0);
      const selected = l === state.layer && String(h) === String(state.head);
      const cell = el("button", {
        class: "cell" + (selected ? " selected" : ""), type: "button",
        title: `layer ${l + 1}, head ${h + 1}`, "aria-label": `open layer ${l + 1}, head ${h + 1} in the head view`,
        onclick: () => { state.layer = l; state.head = String(h); state.view = "head"; $("view").value = "head"; $("layer").value = l; $("head").value = h; redrawAttention(); },
      }, canvas);
      grid.append(cell);
    }
  }
  r.attentionBox.append(el("div", { class: "meta", text: "each square: attention from a token (row) to a token (column), darkest = the square's largest weight. Click one to open it in the head view." }), grid);
}

// ---- saving the view ------------------------------------------------------------------------------
function snapshot() {
  // a copy of the results with canvases turned into images and controls made inert
  const source = $("results");
  const copy = source.cloneNode(true);
  const canvases = source.querySelectorAll("canvas");
  copy.querySelectorAll("canvas").forEach((c, k) => {
    const img = document.createElement("img");
    img.src = canvases[k].toDataURL("image/png");
    img.width = 64; img.height = 64; img.style.imageRendering = "pixelated";
    c.replaceWith(img);
  });
  copy.querySelectorAll("button").forEach((b) => b.setAttribute("tabindex", "-1"));
  return copy;
}

function download(name, blob) {
  const a = el("a", { href: URL.createObjectURL(blob), download: name });
  document.body.append(a);
  a.click();
  setTimeout(() => { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
}

async function save(kind) {
  const stamp = new Date().toISOString().slice(0, 19).replace(/[:T]/g, "-");
  const header = `<h1 style="font-size:1.15rem">bertforge explorer</h1><p class="meta">${escapeHtml($("text").value)}</p>`;
  try {
    if (kind === "html") {
      const html = `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>bertforge explorer: saved view</title><style>${state.css}</style></head><body><main>${header}<section id="results">${snapshot().innerHTML}</section></main></body></html>`;
      download(`bertforge-view-${stamp}.html`, new Blob([html], { type: "text/html" }));
    } else {
      download(`bertforge-view-${stamp}.png`, await renderPng(header));
    }
    $("status").textContent = `saved the view as ${kind.toUpperCase()}`;
  } catch (err) {
    $("status").textContent = "";
    $("results").prepend(el("div", { class: "error", role: "alert", text: `saving as ${kind}: ${err.message}` }));
  }
}

function escapeHtml(text) {
  return text.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
}

function renderPng(header) {
  // the results drawn through an SVG foreignObject onto a canvas: no library needed
  const source = $("results");
  const width = Math.ceil(source.scrollWidth) + 40;
  const height = Math.ceil(source.scrollHeight) + 120;
  const wrapper = document.createElement("div");
  wrapper.setAttribute("xmlns", "http://www.w3.org/1999/xhtml");
  wrapper.innerHTML = `<style>${state.css} body{margin:0}</style><main style="background:#f6f7f9;width:${width}px;font:15px/1.45 system-ui,sans-serif;color:#1d2330">${header}</main>`;
  const section = snapshot();
  section.style.width = `${width - 40}px`;
  wrapper.querySelector("main").append(section);
  const xhtml = new XMLSerializer().serializeToString(wrapper);
  const image = `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}"><foreignObject width="100%" height="100%">${xhtml}</foreignObject></svg>`;
  return new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => {
      const canvas = document.createElement("canvas");
      canvas.width = width; canvas.height = height;
      const ctx = canvas.getContext("2d");
      ctx.fillStyle = "#f6f7f9"; ctx.fillRect(0, 0, width, height);
      ctx.drawImage(img, 0, 0);
      canvas.toBlob((blob) => (blob ? resolve(blob) : reject(new Error("the browser made no PNG"))), "image/png");
    };
    img.onerror = () => reject(new Error("the browser could not draw the view"));
    img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(image);
  });
}

document.addEventListener("DOMContentLoaded", start);
