// The page of transformer-serve: POST /translate, then POST /attention for the sentence clicked.
"use strict";

const $ = (id) => document.getElementById(id);
let sources = [];  // the sentences of the translations shown
let sourcesOptions = {};  // and the beam and target language they were translated with, which the heatmap uses
let attentionShown = 0;  // answers to earlier clicks are dropped

async function call(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)};
  let response;
  try {
    response = await fetch(path, init);
  } catch {  // the browser's "Failed to fetch" says neither what failed nor what to do
    throw new Error("cannot reach the server: is transformer-serve still running?");
  }
  const text = await response.text();
  let data;
  try {
    data = JSON.parse(text);
  } catch {  // a proxy's HTML page or a plain-text 500: one line, not the JSON parser's complaint
    throw new Error(`the server answered ${response.status} ${response.statusText || ""}`.trim() +
                    (response.ok ? " with a body that is not JSON" : ""));
  }
  if (!response.ok) throw new Error(data.error || `the server answered ${response.status} ${response.statusText}`);
  return data;
}

function count(id, name) {  // a whole number of 1 or more: an empty box would be sent as 0 ("beam_size must be >= 1, got 0")
  const value = $(id).value.trim();
  if (!/^[0-9]+$/.test(value) || Number(value) < 1) {
    throw new Error(`${name}: give a whole number of 1 or more` + (value ? `, not ${value}` : ""));
  }
  return Number(value);
}

function showError(error) {
  $("error").textContent = error ? error.message : "";
  $("error").hidden = !error;
}

async function describeModel() {
  const model = await call("/model");
  $("pair").textContent = model.target_languages.length ? model.directions.join(", ") :
    `${model.source_language} → ${model.target_language}`;
  // a multilingual model: the language to translate into (the tag the server puts before the source)
  $("tgt-lang").replaceChildren(...model.target_languages.map((lang) => new Option(lang, lang)));
  $("language").hidden = !model.target_languages.length;
  const bleu = model.scores.bleu ?
    `, BLEU ${model.scores.bleu.score.toFixed(2)} reported` + (model.scores_direction ? ` (${model.scores_direction})` : "") : "";
  $("about").textContent = `${model.engine} engine, ${model.model.n_encoder_layers}+${model.model.n_decoder_layers} ` +
    `layers, d_model ${model.model.d_model}${bleu}`;
  $("beam").value = model.decode.beam_size;
  $("nbest").value = Math.min(3, model.decode.beam_size);
}

async function translate() {
  if ($("translate").disabled) return;  // Ctrl+Enter while a translation runs: not a second request
  const numbered = $("source").value.split("\n").map((line, index) => [line, index + 1])
    .filter(([line]) => line.trim());  // [line, its number in the box]
  const lines = numbered.map(([line]) => line);
  if (!lines.length) return;
  showError(null);
  $("translate").disabled = true;
  $("status").textContent = "translating…";
  try {
    const options = {beam_size: count("beam", "beam"), ...language()};
    const data = await call("/translate", {text: lines, nbest: count("nbest", "n-best"), ...options})
      .catch((error) => {  // "text[2]" counts the lines sent, blank ones left out: name the line of the box
        const line = (found, i) => numbered[Number(i)] ? `line ${numbered[Number(i)][1]}` : found;
        throw new Error(error.message.replace(/^text\[(\d+)\]/, line));
      });
    sources = lines;
    sourcesOptions = options;
    showTranslations(data.translations);
    $("status").textContent = `${lines.length} sentence(s) in ${data.timing.total_ms.toFixed(0)} ms`;
    await showAttention(0);
  } catch (error) {
    showError(error);
    $("status").textContent = "";
  } finally {
    $("translate").disabled = false;
  }
}

function language() {  // the target language chosen, for a multilingual model
  return $("language").hidden ? {} : {tgt_lang: $("tgt-lang").value};
}

function showTranslations(translations) {
  $("results").replaceChildren(...translations.map((translation, index) => {
    const item = document.createElement("li");
    const source = document.createElement("div");
    source.className = "source";
    source.textContent = sources[index];
    source.dir = "auto";  // right-to-left text reads right to left
    const best = document.createElement("div");
    best.dir = "auto";
    best.className = translation.text ? "best" : "best empty";
    best.textContent = translation.text || "(empty translation)";
    const nbest = document.createElement("ol");
    nbest.className = "nbest";
    for (const hypothesis of translation.nbest) {
      const entry = document.createElement("li");
      entry.dir = "auto";
      const score = document.createElement("span");
      score.className = "score";
      score.textContent = hypothesis.score.toFixed(3);
      entry.append(hypothesis.text, " ", score);
      nbest.append(entry);
    }
    item.append(source, best, nbest);
    item.tabIndex = 0;  // reachable with Tab, and Enter or Space shows its heatmap as a click does
    item.addEventListener("click", () => showAttention(index));
    item.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") {
        event.preventDefault();
        showAttention(index);
      }
    });
    return item;
  }));
}

async function showAttention(index) {
  const shown = ++attentionShown;
  $("results").querySelectorAll(":scope > li").forEach((item, i) => item.classList.toggle("selected", i === index));
  try {
    const data = await call("/attention", {text: sources[index], ...sourcesOptions});
    if (shown !== attentionShown) return;
    $("attention-of").textContent = `of sentence ${index + 1}`;
    drawHeatmap($("heatmap"), data);
  } catch (error) {
    showError(error);
  }
}

function shade(weight) {  // 0 white .. 1 dark blue
  const w = Math.max(0, Math.min(1, weight));
  const mix = (from, to) => Math.round(from + (to - from) * w);
  return `rgb(${mix(247, 8)}, ${mix(251, 48)}, ${mix(255, 107)})`;
}

function drawHeatmap(canvas, {source, target, weights}) {
  const cell = 26, font = "13px sans-serif";
  let context = canvas.getContext("2d");
  context.font = font;
  const widest = (labels) => Math.max(0, ...labels.map((label) => context.measureText(label).width));
  const left = Math.ceil(widest(target)) + 10, top = Math.ceil(widest(source)) + 10;  // source labels run upwards
  canvas.width = left + cell * source.length + 2;
  canvas.height = top + cell * target.length + 2;
  context = canvas.getContext("2d");  // resizing reset its state
  context.font = font;
  context.fillStyle = "#fff";
  context.fillRect(0, 0, canvas.width, canvas.height);
  weights.forEach((row, t) => row.forEach((weight, s) => {
    context.fillStyle = shade(weight);
    context.fillRect(left + s * cell, top + t * cell, cell - 1, cell - 1);
  }));
  context.fillStyle = "#222";
  context.textBaseline = "middle";
  context.textAlign = "right";
  target.forEach((piece, t) => context.fillText(piece, left - 6, top + t * cell + cell / 2));
  context.textAlign = "left";
  source.forEach((piece, s) => {
    context.save();
    context.translate(left + s * cell + cell / 2, top - 6);
    context.rotate(-Math.PI / 2);
    context.fillText(piece, 0, 0);
    context.restore();
  });
}

$("translate").addEventListener("click", translate);
$("source").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    translate();
  }
});
describeModel().catch(showError);
