// bertforge explorer: asks the server's JSON API and draws what one or two models make of a
// text (or of a text pair, for a classifier fine-tuned on pairs). Hand-written, no
// dependencies; everything it loads comes from the same server.
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

// A server started with --api_key answers 401 without "Authorization: Bearer KEY": the page
// asks for the key once and keeps it in this tab's sessionStorage (gone when the tab closes).
const KEY_ITEM = "bertforge-api-key";

class KeyNeeded extends Error {}

async function api(path, body) {
  const headers = { "Content-Type": "application/json" };
  const key = sessionStorage.getItem(KEY_ITEM);
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(path, {
    method: body === undefined ? "GET" : "POST",
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let answer;
  try { answer = await response.json(); } catch { answer = null; }
  if (!response.ok) {
    const message = answer && answer.error ? answer.error : `HTTP ${response.status}`;
    if (response.status === 401) {
      sessionStorage.removeItem(KEY_ITEM);
      throw new KeyNeeded(key ? "the server refused this key; check it and try again" : "");
    }
    throw new Error(`${path}: ${message}`);
  }
  return answer;
}

// The nav's /info and /metrics: a plain link cannot send the Authorization header, so with a
// key the page fetches them itself and shows the answer here (without one the link is a link).
async function showRaw(event) {
  const path = event.currentTarget.getAttribute("href");
  if (!sessionStorage.getItem(KEY_ITEM)) return; // no key held: the plain link works
  event.preventDefault();
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(KEY_ITEM)}` };
  let text;
  try {
    const response = await fetch(path, { headers });
    if (response.status === 401) {
      sessionStorage.removeItem(KEY_ITEM);
      askForKey("the server refused this key; check it and try again");
      return;
    }
    text = await response.text();
    if (path === "/info" && response.ok) text = JSON.stringify(JSON.parse(text), null, 2);
    else if (!response.ok) text = `HTTP ${response.status}\n${text}`;
  } catch (err) {
    text = `${path}: ${err.message}`;
  }
  $("raw-title").textContent = `GET ${path}`;
  $("raw-body").textContent = text;
  $("raw").hidden = false;
  $("raw-close").focus();
}

function hideRaw() {
  $("raw").hidden = true;
}

function askForKey(note) {
  $("key-form").hidden = false;
  $("key-note").textContent = note;
  $("api-key").value = "";
  $("api-key").focus();
}

function useKey(event) {
  event.preventDefault();
  const key = $("api-key").value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY_ITEM, key);
  $("key-form").hidden = true;
  $("api-key").value = "";
  start();
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
    if (err instanceof KeyNeeded) { askForKey(err.message); return; }
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
  for (const box of ["text", "text-pair", "question"]) {
    $(box).addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); run(); }
    });
  }
  $("model-a").addEventListener("change", () => { useExample(); updatePairBox(); });
  $("model-b").addEventListener("change", () => { useExample(); updatePairBox(); });
  state.example = { text: $("text").value, question: $("question").value };
  useExample();
  updatePairBox();
  $("view").addEventListener("change", () => { state.view = $("view").value; redrawAttention(); });
  $("layer").addEventListener("change", () => { state.layer = +$("layer").value; redrawAttention(); });
  $("head").addEventListener("change", () => { state.head = $("head").value; redrawAttention(); });
  $("save-html").addEventListener("click", () => save("html"));
  $("save-png").addEventListener("click", () => save("png"));
  run();
}

// ---- an example that fits the model ----------------------------------------------------------
// Each kind of model opens with a text it does something with: a masked LM a [MASK] to fill,
// a tagger names to find, a question-answering model a question and its context. A text the
// user wrote stays; only the example the page put there is swapped.
const EXAMPLES = {
  "masked-lm": { text: "the movie was a [MASK] film about people in town ." },
  classifier: { text: "the movie was a good film about people in town ." },
  "token-classifier": { text: "Ada Lovelace was born in London and worked with Charles Babbage in Paris ." },
  "question-answering": {
    question: "Where was Ada Lovelace born ?",
    text: "Ada Lovelace was born in London and worked with Charles Babbage in Paris .",
  },
  encoder: { text: "the movie was a good film about people in town ." },
};

function useExample() {
  const example = EXAMPLES[modelInfo($("model-a").value).kind];
  if (!example) return;
  // state.example holds what the page itself put in each box: what the user wrote is never it
  if ($("text").value === state.example.text) {
    $("text").value = state.example.text = example.text;
  }
  // a question for a QA model, as the first model or the one compared
  const asks = selectedModels().map(modelInfo).some((m) => m.kind === "question-answering");
  if (asks && $("question").value === state.example.question) {
    $("question").value = state.example.question = EXAMPLES["question-answering"].question;
  }
}

function tokenCap() {
  return Math.min(CAP, state.info.limits.max_attention_tokens);
}

function selectedModels() {
  const names = [$("model-a").value];
  if ($("model-b").value && $("model-b").value !== names[0]) names.push($("model-b").value);
  return names;
}

// ---- the second text of a pair -------------------------------------------------------------
// A classifier fine-tuned on text pairs (/info "inputs": "pairs") reads [CLS] a [SEP] b [SEP];
// one nothing says anything about ("texts or pairs") reads a pair when the second box is filled.
function takes(info) {
  return info.kind === "classifier" && info.inputs ? info.inputs : "texts";
}

function updatePairBox() {
  const infos = selectedModels().map(modelInfo);
  const paired = infos.find((m) => takes(m) === "pairs");
  const optional = infos.find((m) => takes(m) === "texts or pairs");
  $("pair-row").hidden = !paired && !optional;
  const [a, b] = paired ? paired.pair_columns : ["Text", "Second text"];
  // a question-answering model reads a question about the text, its context
  const answers = infos.some((m) => m.kind === "question-answering");
  $("question-row").hidden = !answers;
  $("text-name").textContent = answers && !paired ? "Context" : a;
  $("pair-name").textContent = b;
  // [MASK] means something only to a masked-LM model among the selected ones
  const predicts = infos.some((m) => m.kind === "masked-lm");
  // top-k: words per [MASK], spans per question; nothing to a tagger, a classifier, an encoder
  $("top-k-label").hidden = !infos.some((m) => m.kind === "masked-lm" || m.kind === "question-answering");
  $("text-hint").replaceChildren(
    "(",
    ...(predicts ? ["write ", el("code", { text: "[MASK]" }), " where a word should be predicted; click a token below to mask its word; "] : []),
    "Ctrl+Enter runs)",
  );
  if (paired) {
    $("pair-hint").textContent = `(${paired.name} was fine-tuned on ${a} + ${b} pairs and reads both: [CLS] ${a} [SEP] ${b} [SEP])`;
  } else if (optional) {
    $("pair-hint").textContent = `(optional: ${optional.name} then reads the pair [CLS] text [SEP] second text [SEP])`;
  }
}

function pairText() {
  return $("pair-row").hidden ? "" : $("text-pair").value;
}

function textsFor(info, text, pair) {
  // what a model reads: [text] or [text, pair]
  const kind = takes(info);
  return kind === "pairs" || (kind === "texts or pairs" && pair.trim() !== "") ? [text, pair] : [text];
}

// ---- running a text through the models ------------------------------------------------------
async function run() {
  const text = $("text").value;
  const pair = pairText();
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
  await Promise.all(names.map((name, i) => runModel(name, text, pair, topK, panels[i])));
  setLayerHeadChoices();
  redrawAttention();
  $("run").disabled = false;
  $("status").textContent = "done";
}

async function runModel(name, text, pair, topK, panel) {
  const info = modelInfo(name);
  const errors = el("div", { class: "error", role: "alert" });
  const meta = `${info.kind} · ${info.config.num_hidden_layers} layers × ${info.config.num_attention_heads} heads · hidden ${info.config.hidden_size} · ${info.parameters.toLocaleString()} parameters`;
  panel.append(el("h2", { text: name }), el("div", { class: "meta", text: meta }), errors);
  const fail = (err) => errors.append(el("div", { text: err.message }));
  const texts = textsFor(info, text, pair);
  const paired = texts.length === 2;
  const question = $("question").value;
  // one text or one [text, text_pair] pair; a QA model reads [CLS] question [SEP] context [SEP]
  const asked = info.kind === "question-answering" && question.trim() !== "";
  const example = asked ? [question, text] : paired ? texts : text;
  const r = (state.runs[name] = { name, text, texts, info, panel });
  const cap = Math.min(tokenCap(), info.config.max_position_embeddings);
  try {
    r.tokens = await api("/tokenize", { inputs: texts, model: name }); // WordPieces per text
  } catch (err) {
    fail(err);
    return;
  }
  // the WordPieces, as each kind of model has them: a masked LM's to click and mask, a
  // classifier's coloured by attribution, an encoder's as they are; a tagger's and a QA
  // model's answers are drawn on the text itself (entities, the answer span) instead
  const tokenBox = el("div", { class: "token-rows", role: "group", "aria-label": "WordPieces" });
  const heading = TOKEN_HEADINGS[info.kind];
  if (heading) panel.append(el("h3", { text: heading }), tokenBox);
  r.clickable = info.kind === "masked-lm";
  const jobs = [];
  const outputs = el("div");
  panel.append(outputs);
  if (!paired && pair.trim() !== "") {
    outputs.append(el("p", { class: "hint", text: `${name} reads the first text only (it was not fine-tuned on pairs).` }));
  }
  if (info.kind === "masked-lm") {
    if (!text.includes("[MASK]")) {
      outputs.append(el("p", { class: "hint", text: "No [MASK] in the text: click a token to mask it." }));
    } else {
      jobs.push(api("/fill-mask", { inputs: [text], model: name, top_k: topK })
        .then(([answer]) => drawFillMask(outputs, answer)).catch(fail));
    }
  } else if (info.kind === "classifier" && paired && pair.trim() === "") {
    const [, b] = info.pair_columns;
    outputs.append(el("p", { class: "hint", text: `${name} reads pairs: write the ${b} in the second box.` }));
  } else if (info.kind === "classifier") {
    const prediction = el("div"), legend = el("div");
    outputs.append(prediction, legend);
    jobs.push(api("/predict", { inputs: [paired ? texts : text], model: name, truncate: true })
      .then(([answer]) => drawPrediction(prediction, answer)).catch(fail));
    if (info.routes.includes("/attribute")) {
      jobs.push(api("/attribute", { inputs: example, model: name, steps: 32, max_tokens: cap })
        .then((answer) => { r.attribution = answer; drawLegend(legend, answer); })
        .catch(fail));
    }
  } else if (info.kind === "token-classifier") {
    const entities = el("div");
    outputs.append(entities);
    jobs.push(api("/tag", { inputs: [text], model: name })
      .then(([found]) => drawEntities(entities, text, found, info)).catch(fail));
  } else if (info.kind === "question-answering") {
    const box = el("div");
    outputs.append(box);
    if (question.trim() === "") {
      box.append(el("p", { class: "hint", text: `${name} answers questions: write one in the Question box.` }));
    } else {
      jobs.push(api("/answer", { inputs: [{ question, context: text }], model: name, top_k: topK })
        .then(([found]) => drawAnswer(box, question, text, found)).catch(fail));
    }
  } else {
    outputs.append(el("p", { class: "hint", text: "An encoder without a head: tokens and attention only (its vectors: POST /embed)." }));
  }
  const attentionBox = el("div", { class: "attention" });
  panel.append(el("h3", { text: "Attention" }), attentionBox);
  r.attentionBox = attentionBox;
  if (info.routes.includes("/attention")) {
    jobs.push(api("/attention", { inputs: example, model: name, max_tokens: cap })
      .then((answer) => { r.attention = answer; }).catch(fail));
  }
  await Promise.all(jobs);
  if (heading) drawTokens(tokenBox, r);
}

const TOKEN_HEADINGS = {
  "masked-lm": "WordPieces (click one to mask its word)",
  classifier: "WordPieces (coloured by attribution)",
  encoder: "WordPieces",
};

// ---- tokens ---------------------------------------------------------------------------------
function wordSpan(tokens, i) {
  // the characters of the whole word holding WordPiece i (its ## continuations joined)
  let a = i, b = i;
  while (a > 1 && tokens[a].text.startsWith("##")) a -= 1;
  while (b + 1 < tokens.length - 1 && tokens[b + 1].text.startsWith("##")) b += 1;
  return [tokens[a].start, tokens[b].stop];
}

function maskWord(r, seg, i) {
  const [start, stop] = wordSpan(r.tokens[seg], i);
  const text = r.texts[seg];
  $(seg === 0 ? "text" : "text-pair").value = text.slice(0, start) + "[MASK]" + text.slice(stop);
  run().then(() => { $("status").textContent = `masked “${text.slice(start, stop)}”`; });
}

function segmentPositions(tokens, seg, explained, budget) {
  // For each WordPiece of text `seg` (/tokenize: [CLS] pieces [SEP]) its position in the
  // explained sequence [CLS] a [SEP] (b [SEP]), or -1 where it was cut off; without an
  // explained answer, the first `budget` tokens count as shown.
  const last = tokens.length - 1;
  const positions = tokens.map(() => -1);
  if (explained) {
    const types = explained.token_type_ids || explained.tokens.map(() => 0);
    const at = types.flatMap((t, k) => (t === seg ? [k] : []));
    if (at.length === 0) return positions;
    const offset = seg === 0 ? 1 : 0; // the second text has no [CLS] of its own in a pair
    if (seg === 0) positions[0] = at[0];
    for (let i = 1; i < last && i - 1 + offset < at.length - 1; i++) positions[i] = at[i - 1 + offset];
    positions[last] = at[at.length - 1];
  } else {
    const kept = Math.max(0, Math.min(last - 1, budget - (seg === 0 ? 2 : 1)));
    for (let i = seg === 0 ? 0 : 1; i <= kept; i++) positions[i] = i;
    positions[last] = last;
  }
  return positions;
}

function drawTokens(box, r) {
  // both texts of a pair in one row each: [CLS] a [SEP] / b [SEP], as the model reads them
  const explained = r.attribution || r.attention; // both cut to the same tokens
  const attr = r.attribution ? r.attribution.attributions : null;
  const scale = attr ? Math.max(...attr.map(Math.abs)) : 0;
  const names = r.texts.length === 2 ? (r.info.pair_columns || ["text", "second text"]) : null;
  let budget = tokenCap();
  r.tokens.forEach((tokens, seg) => {
    const row = el("div", { class: "tokens", role: "group", "aria-label": names ? names[seg] : "text" });
    const positions = segmentPositions(tokens, seg, explained, budget);
    let shown = 0;
    tokens.forEach((t, i) => {
      const k = positions[i];
      if (k < 0) return;
      shown += 1;
      const mask = t.text === "[MASK]";
      const cls = "tok" + (t.special ? " special" : "") + (mask ? " mask" : "");
      let node;
      if (t.special || !r.clickable) {
        const title = t.special ? "" : `id ${t.id}, characters ${t.start}–${t.stop}` + (attr ? `, attribution ${attr[k].toFixed(4)}` : "");
        node = el("span", { class: cls, text: t.text, ...(title ? { title } : {}) });
      } else {
        node = el("button", {
          class: cls, type: "button", text: t.text,
          title: `id ${t.id}, characters ${t.start}–${t.stop}` + (attr ? `, attribution ${attr[k].toFixed(4)}` : ""),
          "aria-label": `mask the word of ${t.text}`,
          onclick: () => maskWord(r, seg, i),
        });
      }
      if (attr) {
        const [red, green, blue] = (attr[k] >= 0 ? "214,70,60" : "40,110,200").split(",");
        const a = scale ? (Math.min(1, Math.abs(attr[k]) / scale) * 0.75).toFixed(3) : 0;
        node.style.background = `rgba(${red},${green},${blue},${a})`;
      }
      row.append(node);
    });
    const hidden = tokens.length - (seg === 0 ? 0 : 1) - shown;
    if (hidden > 0) {
      row.append(el("span", { class: "more", text: `… ${hidden} more tokens not shown (cap ${tokenCap()})` }));
    }
    budget -= shown;
    if (names) box.append(el("div", { class: "segment" }, el("span", { class: "seg-name", text: names[seg] }), row));
    else box.append(row);
  });
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
  // /predict's answer: {label, scores} or {value}
  box.append(el("h3", { text: "Prediction" }));
  if ("value" in answer) {
    box.append(el("p", { class: "prediction" }, "Value: ", el("strong", { text: answer.value.toFixed(4) })));
  } else {
    const rows = Object.entries(answer.scores).sort((a, b) => b[1] - a[1]);
    box.append(el("p", { class: "prediction" }, "Label: ", el("strong", { text: answer.label })), bars(rows));
  }
}

function drawLegend(box, answer) {
  // what the token colours (/attribute's answer) mean
  const cut = answer.truncated ? `; computed on the first ${answer.tokens.length} tokens` : "";
  box.append(el("p", { class: "legend" },
    el("span", { class: "sw", style: "background:rgba(214,70,60,.7)" }), " pushes towards ",
    el("strong", { text: answer.target || "the value" }), "  ",
    el("span", { class: "sw", style: "background:rgba(40,110,200,.7)" }), " pushes away",
    ` (integrated gradients, ${answer.steps} steps, completeness gap ${answer.delta.toExponential(1)}${cut})`));
}

// ---- entities and answers ------------------------------------------------------------------------
const PALETTE = ["#f7b267", "#8ecae6", "#b5e48c", "#cdb4db", "#ffd166", "#ffafcc", "#90e0ef", "#e9c46a"];

function entityTypes(info, found) {
  // the types the tagger's labels name (B-PER, I-PER -> PER), sorted, so a colour means the same
  // type in every run; then any the labels do not follow the B-/I- scheme for
  const types = new Set();
  for (const label of info.labels || []) {
    const m = /^[BIES]-(.+)$/.exec(label);
    if (m) types.add(m[1]);
  }
  const sorted = [...types].sort();
  for (const e of found) if (!sorted.includes(e.entity)) sorted.push(e.entity);
  return sorted;
}

function drawEntities(box, text, found, info) {
  // /tag's answer: the text with each entity marked inline in its type's colour, and a legend
  const types = entityTypes(info, found);
  const colour = (type) => PALETTE[types.indexOf(type) % PALETTE.length];
  const tagged = el("p", { class: "tagged" });
  let at = 0;
  for (const e of found) {
    if (e.start > at) tagged.append(text.slice(at, e.start));
    const mark = el("mark", { class: "ent", "data-entity": e.entity, title: `${e.entity} · ${(e.score * 100).toFixed(1)}% · characters ${e.start}–${e.end}` },
      text.slice(e.start, e.end), el("span", { class: "ent-type", text: e.entity }));
    mark.style.background = colour(e.entity);
    tagged.append(mark);
    at = e.end;
  }
  tagged.append(text.slice(at));
  const legend = el("p", { class: "legend ent-legend" }, "Entity types: ");
  for (const type of types) {
    const swatch = el("span", { class: "sw" });
    swatch.style.background = colour(type);
    legend.append(el("span", { class: "ent-key", "data-entity": type }, swatch, " " + type));
  }
  box.append(el("h3", { text: "Entities" }), tagged, legend);
  if (found.length === 0) box.append(el("p", { class: "hint", text: "No entities found in this text." }));
}

function formatScore(score) {
  return score === null ? "–" : score.toFixed(3);
}

function drawAnswer(box, question, context, found) {
  // /answer's answer: the span highlighted in its context, the next-best spans listed below
  box.append(el("h3", { text: "Answer" }),
    el("p", { class: "question" }, "Question: ", el("em", { text: question })),
    el("p", { class: "prediction" }, "Answer: ", el("strong", { class: "answer-text", text: found.answer || "(no answer)" }),
      el("span", { class: "hint", text: ` score ${formatScore(found.score)} · ${(found.probability * 100).toFixed(1)}%` })));
  const shown = el("p", { class: "context" });
  if (found.end > found.start) {
    shown.append(context.slice(0, found.start),
      el("mark", { class: "answer", title: `characters ${found.start}–${found.end}`, text: context.slice(found.start, found.end) }),
      context.slice(found.end));
  } else {
    shown.append(context);
  }
  box.append(shown);
  if (found.alternatives.length === 0) return;
  const rows = found.alternatives.map((a) => el("tr", { class: "alt" },
    el("td", { class: "span-text", text: a.answer }),
    el("td", { text: `${a.start}–${a.end}` }),
    el("td", { class: "num", text: formatScore(a.score) }),
    el("td", { class: "num", text: (a.probability * 100).toFixed(1) + "%" })));
  box.append(el("h3", { text: "Next-best spans" }),
    el("table", { class: "alternatives" },
      el("thead", {}, el("tr", {}, ...["span", "characters", "score", "probability"].map((h) => el("th", { text: h })))),
      el("tbody", {}, ...rows)));
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
  const types = r.attention.token_type_ids || [];
  tokens.forEach((t, i) => {
    const seg = types[i] === 1 ? "seg1" : ""; // the second text of a pair
    const a = svg("text", { x: left - 6, y: 14 + i * rowH, "text-anchor": "end", tabindex: 0, class: seg });
    a.textContent = t;
    const b = svg("text", { x: right + 6, y: 14 + i * rowH, class: seg });
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
  const texts = [$("text").value, pairText()].filter((t) => t !== "");
  const header = `<h1 style="font-size:1.15rem">bertforge explorer</h1>${texts.map((t) => `<p class="meta">${escapeHtml(t)}</p>`).join("")}`;
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

document.addEventListener("DOMContentLoaded", () => {
  $("key-form").addEventListener("submit", useKey);
  for (const link of document.querySelectorAll("nav a[data-raw]")) link.addEventListener("click", showRaw);
  $("raw-close").addEventListener("click", hideRaw);
  start();
});
