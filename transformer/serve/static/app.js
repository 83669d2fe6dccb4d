// The page of transformer-serve: POST /translate, then POST /attention for the sentence clicked.
"use strict";

const $ = (id) => document.getElementById(id);
let sources = [];  // the sentences of the translations shown
let sourcesLanguage = {};  // and the target language they were translated into
let attentionShown = 0;  // answers to earlier clicks are dropped

async function call(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)};
  const response = await fetch(path, init);
  const data = await response.json();
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
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
  const lines = $("source").value.split("\n").filter((line) => line.trim());
  if (!lines.length) return;
  showError(null);
  $("translate").disabled = true;
  $("status").textContent = "translating…";
  try {
    const chosen = language();
    const data = await call("/translate", {text: lines, beam_size: Number($("beam").value),
                                           nbest: Number($("nbest").value), ...chosen});
    sources = lines;
    sourcesLanguage = chosen;
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
    const best = document.createElement("div");
    best.className = translation.text ? "best" : "best empty";
    best.textContent = translation.text || "(empty translation)";
    const nbest = document.createElement("ol");
    nbest.className = "nbest";
    for (const hypothesis of translation.nbest) {
      const entry = document.createElement("li");
      const score = document.createElement("span");
      score.className = "score";
      score.textContent = hypothesis.score.toFixed(3);
      entry.append(hypothesis.text, " ", score);
      nbest.append(entry);
    }
    item.append(source, best, nbest);
    item.addEventListener("click", () => showAttention(index));
    return item;
  }));
}

async function showAttention(index) {
  const shown = ++attentionShown;
  $("results").querySelectorAll(":scope > li").forEach((item, i) => item.classList.toggle("selected", i === index));
  try {
    const data = await call("/attention", {text: sources[index], beam_size: Number($("beam").value),
                                           ...sourcesLanguage});
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
  if (event.key === "Enter" && event.ctrlKey) translate();
});
describeModel().catch(showError);
