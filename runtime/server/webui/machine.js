// The machine page: the placement map of the loaded model (GET
// /v1/ats/placement) and live figures from /metrics. Every figure the
// server does not report says so, rather than showing a made-up zero. The
// first figures and the map come with the page (its first state), so it
// shows them at once; with an API key they come from the API.

import { api, el, fmtBytes, fmtRate, firstState, showModelName, APIError } from "./common.js";

const $ = (id) => document.getElementById(id);
const pollMS = 2000;
const notReported = "not reported";

// The roles of a block's units, in the order they run; roles the contract
// does not list yet follow in the order they appear.
const roleOrder = ["attn_q", "attn_k", "attn_v", "attention", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "ffn_moe"];

let placement = null;
let lastReplans;

// ---- /metrics ----

// parseMetrics reads Prometheus's text format into name → [{labels, value}].
export function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    if (m[2]) {
      for (const lm of m[2].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) {
        labels[lm[1]] = lm[2].replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
      }
    }
    const value = parseFloat(m[3]);
    if (!out.has(m[1])) out.set(m[1], []);
    out.get(m[1]).push({ labels, value });
  }
  return out;
}

// one returns the value of a series (with the given labels), or undefined.
function one(mets, name, labels = {}) {
  const samples = mets.get(name);
  if (!samples) return undefined;
  const s = samples.find((x) => Object.entries(labels).every(([k, v]) => x.labels[k] === v));
  return s ? s.value : undefined;
}

function setText(id, text, missing) {
  const e = $(id);
  e.textContent = text;
  e.classList.toggle("missing", !!missing);
}

function renderMetrics(mets) {
  const has = (name) => mets && mets.has(name);
  const get = (name, labels) => (mets ? one(mets, name, labels) : undefined);

  // VRAM: ats's own allocations against its budget.
  const used = get("ats_vram_used_bytes");
  const budget = has("ats_vram_budget_bytes") ? get("ats_vram_budget_bytes") : placement ? placement.budget_bytes : undefined;
  setText("vram-value", used === undefined ? notReported : fmtBytes(used), used === undefined);
  const fill = $("vram-bar");
  const frac = used !== undefined && budget > 0 ? Math.min(1, used / budget) : 0;
  fill.style.width = (frac * 100).toFixed(1) + "%";
  fill.classList.toggle("over", used !== undefined && budget > 0 && used > budget);
  $("vram-sub").textContent = "budget " + (budget === undefined ? notReported : fmtBytes(budget)) +
    (budget !== undefined && !has("ats_vram_budget_bytes") ? " (from the plan)" : "");
  const gpus = $("gpu-list");
  gpus.replaceChildren();
  for (const s of (mets && mets.get("ats_gpu_memory_used_bytes")) || []) {
    const total = get("ats_gpu_memory_total_bytes", s.labels);
    const util = get("ats_gpu_utilization_ratio", s.labels);
    gpus.append(el("li", { text: `GPU ${s.labels.gpu} ${s.labels.name}: ${fmtBytes(s.value)} of ${fmtBytes(total)} in use` +
      (util !== undefined ? `, ${(util * 100).toFixed(0)}% busy` : "") }));
  }

  // Speed of the last request (the gauges change when a request ends).
  const generated = get("ats_generated_tokens_total");
  const decode = get("ats_decode_tokens_per_second");
  const prefill = get("ats_prefill_tokens_per_second");
  if (decode === undefined) setText("decode-value", notReported, true);
  else if (!generated) setText("decode-value", "no generation yet", true);
  else setText("decode-value", fmtRate(decode, "tok/s"));
  const speedSub = [];
  speedSub.push("prefill " + (prefill === undefined ? notReported : generated ? fmtRate(prefill, "tok/s") : "–"));
  if (placement && placement.predicted) {
    const p = placement.predicted;
    if (p.decode_tokens_per_s) speedSub.push("plan predicts " + fmtRate(p.decode_tokens_per_s, "tok/s"));
  }
  const running = get("ats_requests_running");
  speedSub.push(running ? "generating now" : "last request");
  $("speed-sub").textContent = speedSub.join(" · ");

  // Link bandwidth between CPU and GPU.
  const link = get("ats_link_bytes_per_second");
  setText("link-value", link === undefined ? notReported : fmtBytes(link) + "/s", link === undefined);
  const pcie = [];
  for (const s of (mets && mets.get("ats_gpu_pcie_rx_bytes_per_second")) || []) {
    const tx = get("ats_gpu_pcie_tx_bytes_per_second", s.labels);
    pcie.push(`PCIe GPU ${s.labels.gpu}: ${fmtBytes(s.value)}/s to the GPU, ${fmtBytes(tx)}/s back`);
  }
  $("link-sub").textContent = pcie.length ? pcie.join("; ") : "PCIe counters " + notReported;

  // Promotions: CPU weights copied to the GPU for the last decode step.
  const promoted = has("ats_promoted_bytes") ? get("ats_promoted_bytes") : get("ats_promoted_weight_bytes");
  setText("promo-value", promoted === undefined ? notReported : fmtBytes(promoted), promoted === undefined);
  const replans = get("ats_replans_total");
  $("promo-sub").textContent = "in the last decode step · replans " + (replans === undefined ? notReported : String(replans));
  if (replans !== undefined && lastReplans !== undefined && replans !== lastReplans) loadPlacement();
  lastReplans = replans;

  // Weights by device.
  const wg = get("ats_weight_bytes", { device: "gpu" });
  const wc = get("ats_weight_bytes", { device: "cpu" });
  const backend = ((mets && mets.get("ats_backend_info")) || []).map((s) => s.labels.backend).join(", ");
  if (wg === undefined && wc === undefined) setText("weights-value", notReported, true);
  else setText("weights-value", wg > 0 || wc === undefined ? `${fmtBytes(wg)} GPU` : `${fmtBytes(wc)} CPU`);
  $("weights-sub").textContent = `GPU ${fmtBytes(wg)} · CPU ${fmtBytes(wc)} · backend ${backend || notReported}`;

  // Context and queue.
  const ctxUsed = get("ats_context_tokens");
  const ctxSize = get("ats_context_size");
  setText("context-value", ctxUsed === undefined ? notReported : `${ctxUsed} / ${ctxSize === undefined ? "?" : ctxSize}`, ctxUsed === undefined);
  const queue = get("ats_queue_length");
  $("context-sub").textContent = "tokens in the KV cache · queue " + (queue === undefined ? notReported : String(queue)) +
    (running ? " · 1 running" : "");
}

function showMetrics(text) {
  renderMetrics(parseMetrics(text));
  $("metrics-status").textContent = "Live from /metrics, every " + pollMS / 1000 + " s.";
  $("metrics-status").classList.remove("error");
}

async function pollMetrics() {
  if (document.hidden) {
    // Nobody is looking: ask again later rather than load the server.
    setTimeout(pollMetrics, pollMS);
    return;
  }
  try {
    showMetrics(await (await api("/metrics")).text());
  } catch (e) {
    renderMetrics(null);
    $("metrics-status").textContent = "Metrics " + notReported + ": " + e.message;
    $("metrics-status").classList.add("error");
  }
  setTimeout(pollMetrics, pollMS);
}

// ---- the placement map ----

async function loadPlacement() {
  try {
    showPlacement(await (await api("/v1/ats/placement")).json(), null);
  } catch (e) {
    showPlacement(null, e);
  }
}

// showPlacement draws the map p, or says why there is none (e: the API's
// error; status 404 when the model runs on the CPU only).
function showPlacement(p, e) {
  const status = $("placement-status");
  if (p) {
    placement = p;
    status.textContent = "";
    status.classList.remove("error");
    renderPlacement(placement);
  } else {
    placement = null;
    $("placement-map").replaceChildren();
    $("placement-outside").replaceChildren();
    $("placement-summary").replaceChildren();
    $("cell-info").hidden = true;
    document.querySelector(".legend").hidden = true;
    if (e.status === 404) {
      status.textContent = "No placement map: the model runs on the CPU only (no CPU+GPU plan).";
      status.classList.remove("error");
    } else {
      status.textContent = "Placement map unavailable: " + e.message;
      status.classList.add("error");
    }
  }
}

function ms(s) {
  return typeof s === "number" ? (s * 1000).toFixed(3) + " ms" : "?";
}

function unitText(u, routed) {
  return `${u.name}: ${u.backend.toUpperCase()} · ${u.type || "?"} · ${fmtBytes(u.bytes)} · CPU ${ms(u.cpu_s)}, GPU ${ms(u.gpu_s)}` +
    (routed && routed.has(u.name) ? " · routed: at decode the GPU takes a share of the experts its tokens choose" : "");
}

function renderPlacement(p) {
  const units = Array.isArray(p.units) ? p.units : [];
  // The CPU MoE layers whose decode steps hand the GPU a share of the
  // chosen experts: CPU cells with a GPU stripe.
  const routed = new Set(Array.isArray(p.routed) ? p.routed : []);
  document.querySelector(".legend").hidden = false;
  $("legend-routed").hidden = routed.size === 0;
  $("cell-info").hidden = false;

  // Summary.
  const dl = $("placement-summary");
  dl.replaceChildren();
  const onGPU = units.filter((u) => u.backend === "gpu").length;
  const rows = [
    ["Model", p.model],
    ["Architecture", p.arch],
    ["Layers", p.layers],
    ["Optimised for", p.optimized_for],
    ["VRAM budget", fmtBytes(p.budget_bytes)],
    ["Buffers on the GPU", fmtBytes(p.fixed_bytes)],
    ["Weights on the GPU", fmtBytes(p.weights_gpu_bytes)],
    ["Weights on the CPU", fmtBytes(p.weights_cpu_bytes)],
    ["Units on the GPU", `${onGPU} of ${units.length}`],
  ];
  if (Array.isArray(p.routed) && p.routed.length) {
    // Decode hands the GPU a share of the experts its tokens choose in
    // these CPU MoE layers (their weights alone cross the link).
    rows.push(["MoE layers routed at decode", `${p.routed.length}: the GPU takes ${Math.round(100 * (p.routed_share || 0))}% ` +
      `of the chosen experts, up to ${p.routed_experts} a layer`]);
  }
  if (p.predicted) {
    rows.push(["Predicted decode", fmtRate(p.predicted.decode_tokens_per_s, "tok/s")]);
    rows.push(["Predicted prefill", fmtRate(p.predicted.prefill_tokens_per_s, "tok/s") +
      (p.predicted.prefill_batch ? ` (batch ${p.predicted.prefill_batch})` : "")]);
  }
  for (const [k, v] of rows) {
    if (v === undefined || v === null || v === "") continue;
    dl.append(el("div", {}, el("dt", { text: k }), el("dd", { text: String(v) })));
  }

  // The grid: a row per role, a column per layer.
  const inBlocks = units.filter((u) => u.layer >= 0);
  const layers = Math.max(p.layers || 0, ...inBlocks.map((u) => u.layer + 1));
  const roles = roleOrder.filter((r) => inBlocks.some((u) => u.role === r));
  for (const u of inBlocks) if (!roles.includes(u.role)) roles.push(u.role);
  const cells = new Map(); // role/layer → units
  for (const u of inBlocks) {
    const k = u.role + "/" + u.layer;
    if (!cells.has(k)) cells.set(k, []);
    cells.get(k).push(u);
  }
  const map = $("placement-map");
  map.replaceChildren();
  map.style.gridTemplateColumns = `max-content repeat(${Math.max(layers, 1)}, minmax(5px, 1fr))`;
  const every = layers > 40 ? 10 : layers > 16 ? 5 : 1;
  map.append(el("div", { class: "corner", text: "layer" }));
  for (let l = 0; l < layers; l++) map.append(el("div", { class: "col-head", text: l % every === 0 ? String(l) : "" }));
  const info = $("cell-info");
  for (const role of roles) {
    map.append(el("div", { class: "row-head", text: role }));
    for (let l = 0; l < layers; l++) {
      const us = cells.get(role + "/" + l) || [];
      const backends = new Set(us.map((u) => u.backend));
      const backend = backends.size === 0 ? "none" : backends.size > 1 ? "mixed" : [...backends][0];
      const text = us.length ? us.map((u) => unitText(u, routed)).join("\n") : `layer ${l} has no ${role}`;
      const isRouted = us.some((u) => routed.has(u.name));
      const show = () => (info.textContent = text);
      map.append(el("div", { class: "cell " + backend + (isRouted ? " routed" : ""), role: "gridcell", tabindex: us.length ? "0" : false,
        "data-layer": l, "data-role": role, "data-backend": backend, "data-routed": isRouted, title: text,
        onmouseenter: show, onfocus: show, onclick: show }));
    }
  }

  // Units outside the blocks (embedding, output).
  const outside = $("placement-outside");
  outside.replaceChildren();
  for (const u of units.filter((u) => !(u.layer >= 0))) {
    const text = unitText(u, routed);
    const show = () => (info.textContent = text);
    outside.append(el("span", { class: "chip " + u.backend, "data-role": u.role, "data-backend": u.backend, title: text,
      tabindex: "0", text: `${u.role} · ${u.backend.toUpperCase()} · ${fmtBytes(u.bytes)}`,
      onmouseenter: show, onfocus: show, onclick: show }));
  }
}

showModelName();
const first = firstState();
if (first && !first.key_needed && typeof first.metrics === "string") {
  if (first.placement) showPlacement(first.placement, null);
  else showPlacement(null, new APIError(first.placement_status || 500, first.placement_message || "no placement map"));
  showMetrics(first.metrics);
  setTimeout(pollMetrics, pollMS);
} else {
  loadPlacement().then(pollMetrics);
}
