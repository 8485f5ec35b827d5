// The chat page: conversations kept in localStorage, replies streamed from
// /v1/chat/completions (server-sent events) and shown as markdown
// (markdown.js: never as HTML), reasoning folded away, a stop button that
// aborts the request (the server then stops generating), regenerate for
// the last reply and edit-and-resend for a message of the user.

import { api, apiKey, setAPIKey, el, load, save, showModelName, copyText, APIError } from "./common.js";
import { renderMarkdown } from "./markdown.js";

const convStore = "ats.conversations";
const currentStore = "ats.current";
const settingsStore = "ats.settings";

// Settings fields, by input id suffix, and how each goes into a request.
const numeric = ["temperature", "top_p", "top_k", "min_p", "repeat_penalty", "max_tokens", "seed"];
const integer = new Set(["top_k", "max_tokens", "seed"]);

const $ = (id) => document.getElementById(id);

let conversations = load(convStore, []);
if (!Array.isArray(conversations)) conversations = [];
// A reply cut short by closing or reloading the page stays as it was.
for (const c of conversations) {
  for (const m of c.messages || []) {
    if (m.pending) {
      m.pending = false;
      m.stopped = true;
    }
  }
}
let currentID = load(currentStore, null);
let settings = load(settingsStore, {});
let modelID = "";
let streaming = null; // {controller, msg, view} while a reply streams

function persist() {
  if (!save(convStore, conversations)) {
    // Storage full: drop the oldest conversations rather than lose the new one.
    while (conversations.length > 1 && !save(convStore, conversations)) conversations.pop();
  }
  save(currentStore, currentID);
}

function current() {
  return conversations.find((c) => c.id === currentID) || null;
}

function newConversation() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8), title: "New chat", created: Date.now(), messages: [] };
  conversations.unshift(c);
  currentID = c.id;
  persist();
  return c;
}

// ---- the conversation list ----

function renderSidebar() {
  const list = $("conversations");
  list.replaceChildren();
  for (const c of conversations) {
    const item = el("li", { class: c.id === currentID ? "active" : "", "data-id": c.id },
      el("button", { type: "button", class: "conv-title", text: c.title || "New chat", title: c.title,
        onclick: () => select(c.id) }),
      el("button", { type: "button", class: "conv-delete", text: "×", title: "Delete this conversation",
        "aria-label": "Delete conversation", onclick: () => remove(c.id) }));
    list.append(item);
  }
}

function select(id) {
  if (streaming) return;
  currentID = id;
  persist();
  renderSidebar();
  renderMessages();
}

function remove(id) {
  if (streaming && current() && current().id === id) return;
  conversations = conversations.filter((c) => c.id !== id);
  if (currentID === id) currentID = conversations.length ? conversations[0].id : null;
  persist();
  renderSidebar();
  renderMessages();
}

// ---- messages ----

let views = []; // the views of the current conversation's messages, in order

// messageView builds the element of one message (the i-th of its
// conversation) and returns it with the parts a stream updates.
function messageView(m, i) {
  const content = el("div", { class: "content" });
  const reasoningText = el("div", { class: "reasoning-text" });
  const reasoningLabel = el("summary", { text: "Reasoning" });
  const reasoning = el("details", { class: "reasoning" }, reasoningLabel, reasoningText);
  const meta = el("div", { class: "meta" });
  const actions = el("div", { class: "actions" });
  const box = el("div", { class: "message " + m.role, "data-role": m.role, "data-index": i },
    el("div", { class: "role", text: m.role === "user" ? "You" : "Model" }), reasoning, content, meta, actions);
  const view = { box, content, reasoning, reasoningText, reasoningLabel, meta, actions, index: i, shown: null };
  updateView(view, m);
  return view;
}

function updateView(v, m) {
  // Replies are markdown; what the user typed shows as typed.
  const text = m.content || "";
  if (v.shown !== text) {
    v.shown = text;
    if (m.role === "assistant") v.content.replaceChildren(renderMarkdown(text, copyText));
    else v.content.textContent = text;
  }
  const r = m.reasoning || "";
  v.reasoning.hidden = r === "";
  v.reasoningText.textContent = r;
  v.reasoningLabel.textContent = m.thinking ? "Reasoning (thinking…)" : "Reasoning";
  v.box.classList.toggle("streaming", !!m.pending);
  const parts = [];
  if (m.stats) {
    const s = m.stats;
    parts.push(`${s.predicted_n} tokens`);
    if (s.predicted_per_second) parts.push(`${s.predicted_per_second.toFixed(1)} tok/s`);
    if (s.prompt_n !== undefined) parts.push(`prompt ${s.prompt_n}${s.cache_n ? ` (+${s.cache_n} cached)` : ""}`);
    if (m.finish === "length") parts.push("stopped at the token limit");
  }
  if (m.stopped) parts.push("stopped");
  v.meta.textContent = parts.join(" · ");
  v.meta.classList.toggle("error", !!m.error);
  if (m.error) v.meta.textContent = (parts.length ? parts.join(" · ") + " · " : "") + "error: " + m.error;
  renderActions(v, m);
}

// renderActions puts a message's buttons under it: Edit for the user's,
// Copy for replies, and Regenerate for the last reply.
function renderActions(v, m) {
  const c = current();
  const last = c && v.index === c.messages.length - 1;
  const buttons = [];
  if (!m.pending) {
    if (m.role === "user") {
      buttons.push(el("button", { type: "button", class: "act-edit", text: "Edit", title: "Edit this message and send it again",
        onclick: () => startEdit(v.index) }));
    } else {
      buttons.push(el("button", { type: "button", class: "act-copy", text: "Copy", title: "Copy the reply's text",
        onclick: (ev) => copyText(m.content || "", ev.currentTarget) }));
      if (last) {
        buttons.push(el("button", { type: "button", class: "act-regenerate", text: "Regenerate", title: "Ask for another reply",
          onclick: regenerate }));
      }
    }
  }
  v.actions.replaceChildren(...buttons);
}

function renderMessages() {
  const box = $("messages");
  box.replaceChildren();
  const c = current();
  const msgs = c ? c.messages : [];
  $("empty").hidden = msgs.length > 0;
  views = msgs.map((m, i) => messageView(m, i));
  for (const v of views) box.append(v.box);
  box.scrollTop = box.scrollHeight;
}

function nearBottom(box) {
  return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
}

// startEdit turns the i-th message (the user's) into a text box; sending
// it drops everything after it and asks for a new reply.
function startEdit(i) {
  const c = current();
  if (streaming || !c || !c.messages[i] || c.messages[i].role !== "user") return;
  const v = views[i];
  const input = el("textarea", { class: "edit-input", rows: "3", "aria-label": "Edit the message" });
  input.value = c.messages[i].content || "";
  const send = () => {
    const text = input.value;
    if (!text.trim()) return;
    resendEdited(i, text);
  };
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      send();
    } else if (ev.key === "Escape") {
      renderMessages();
    }
  });
  v.content.replaceChildren(input);
  v.shown = null;
  v.actions.replaceChildren(
    el("button", { type: "button", class: "edit-send primary", text: "Send", onclick: send }),
    el("button", { type: "button", class: "edit-cancel", text: "Cancel", onclick: () => renderMessages() }));
  input.focus();
}

function resendEdited(i, text) {
  const c = current();
  if (streaming || !c || checkCustom() instanceof Error) return;
  c.messages = c.messages.slice(0, i + 1);
  c.messages[i].content = text;
  if (i === 0) c.title = titleOf(text);
  generate(c);
}

// regenerate replaces the last reply with a new one.
function regenerate() {
  const c = current();
  if (streaming || !c || !c.messages.length || c.messages[c.messages.length - 1].role !== "assistant") return;
  if (checkCustom() instanceof Error) return;
  c.messages.pop();
  generate(c);
}

function titleOf(text) {
  return text.trim().replace(/\s+/g, " ").slice(0, 48);
}

// ---- settings ----

function renderSettings() {
  for (const k of numeric) {
    const v = settings[k];
    $("set-" + k).value = v === undefined || v === null ? "" : v;
  }
  $("set-system").value = settings.system || "";
  $("set-thinking").value = settings.thinking || "";
  $("set-custom").value = settings.custom || "";
  $("set-apikey").value = apiKey();
  checkCustom();
}

function readSettings() {
  const s = {};
  for (const k of numeric) {
    const raw = $("set-" + k).value.trim();
    if (raw === "") continue;
    const v = integer.has(k) ? parseInt(raw, 10) : parseFloat(raw);
    if (isFinite(v)) s[k] = v;
  }
  s.system = $("set-system").value;
  s.thinking = $("set-thinking").value;
  s.custom = $("set-custom").value;
  settings = s;
  save(settingsStore, settings);
  setAPIKey($("set-apikey").value.trim());
  checkCustom();
}

// customFields parses the extra JSON fields; it returns an Error when they
// are not a JSON object.
function customFields() {
  const raw = (settings.custom || "").trim();
  if (raw === "") return {};
  try {
    const v = JSON.parse(raw);
    if (v === null || typeof v !== "object" || Array.isArray(v)) return new Error("must be a JSON object");
    return v;
  } catch (e) {
    return new Error(e.message);
  }
}

function checkCustom() {
  const v = customFields();
  const out = $("custom-error");
  out.hidden = !(v instanceof Error);
  out.textContent = v instanceof Error ? "Extra request fields: " + v.message : "";
  return v;
}

// showDefaults greys the server's defaults (GET /props) into the fields.
async function showDefaults() {
  try {
    const props = await (await api("/props")).json();
    const p = (props.default_generation_settings || {}).params || {};
    for (const k of numeric) {
      if (k === "seed" || k === "max_tokens") continue;
      if (typeof p[k] === "number") $("set-" + k).placeholder = String(Math.round(p[k] * 1000) / 1000);
    }
    const nctx = (props.default_generation_settings || {}).n_ctx;
    if (nctx) $("set-max_tokens").placeholder = `until done (context ${nctx})`;
  } catch {
    // Older servers have no /props: the fields just stay empty.
  }
}

// ---- sending ----

function requestBody(c) {
  const messages = [];
  if ((settings.system || "").trim()) messages.push({ role: "system", content: settings.system });
  for (const m of c.messages) {
    if (m.pending) continue;
    if (m.role === "assistant" && !m.content && (m.error || m.stopped)) continue;
    messages.push({ role: m.role, content: m.content || "" });
  }
  const body = { model: modelID || undefined, messages, stream: true, stream_options: { include_usage: true } };
  for (const k of numeric) if (settings[k] !== undefined) body[k] = settings[k];
  if (settings.thinking === "on") body.chat_template_kwargs = { enable_thinking: true };
  if (settings.thinking === "off") body.chat_template_kwargs = { enable_thinking: false };
  return Object.assign(body, customFields());
}

async function send(text) {
  if (streaming || !text.trim() || checkCustom() instanceof Error) return;
  const c = current() || newConversation();
  if (c.messages.length === 0) c.title = titleOf(text);
  c.messages.push({ role: "user", content: text });
  await generate(c);
}

// generate asks for the reply to c's messages and streams it into a new
// message at the end.
async function generate(c) {
  if (streaming) return;
  const body = requestBody(c);
  const msg = { role: "assistant", content: "", reasoning: "", pending: true };
  c.messages.push(msg);
  // Most recently used first.
  conversations = [c, ...conversations.filter((x) => x !== c)];
  persist();
  renderSidebar();
  renderMessages();
  const box = $("messages");
  const view = views[views.length - 1];
  const controller = new AbortController();
  streaming = { controller, msg, view };
  setBusy(true);
  try {
    const resp = await api("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    await readStream(resp, msg, view, box);
  } catch (e) {
    if (e.name === "AbortError") {
      msg.stopped = true;
    } else {
      msg.error = e.message || String(e);
      if (e instanceof APIError && e.status === 401) $("set-apikey").focus();
    }
  } finally {
    msg.pending = false;
    msg.thinking = false;
    streaming = null;
    updateView(view, msg);
    persist();
    setBusy(false);
    $("input").focus();
  }
}

// readStream reads the server-sent events of a streamed chat completion
// into msg, updating its view as text arrives.
async function readStream(resp, msg, view, box) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, end);
      buf = buf.slice(end + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (data === "") continue;
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || "the server reported an error");
      const follow = nearBottom(box);
      const choice = (chunk.choices || [])[0];
      if (choice) {
        const d = choice.delta || {};
        if (d.reasoning_content) {
          msg.reasoning += d.reasoning_content;
          msg.thinking = true;
        }
        if (d.content) {
          msg.content += d.content;
          msg.thinking = false;
        }
        for (const tc of d.tool_calls || []) {
          const f = tc.function || {};
          msg.content += (f.name ? `\n[tool call ${f.name}] ` : "") + (f.arguments || "");
        }
        if (choice.finish_reason) msg.finish = choice.finish_reason;
      }
      if (chunk.timings) msg.stats = chunk.timings;
      scheduleUpdate(view, msg, box, follow);
    }
  }
}

// scheduleUpdate redraws a streaming message once per frame, however many
// pieces arrive in it: the markdown is rendered anew each time.
let frame = 0;
function scheduleUpdate(view, msg, box, follow) {
  if (frame) return;
  frame = requestAnimationFrame(() => {
    frame = 0;
    updateView(view, msg);
    if (follow) box.scrollTop = box.scrollHeight;
  });
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  $("new-chat").disabled = busy;
  document.body.classList.toggle("busy", busy);
}

// ---- wiring ----

function init() {
  renderSettings();
  renderSidebar();
  renderMessages();
  setBusy(false);

  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = $("input");
    const text = input.value;
    // Invalid extra request fields keep the message in the box, said why.
    if (!text.trim() || streaming || checkCustom() instanceof Error) return;
    input.value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => {
    if (streaming) streaming.controller.abort();
  });
  $("new-chat").addEventListener("click", () => {
    if (streaming) return;
    const c = current();
    if (c && c.messages.length === 0) return; // already on an empty one
    newConversation();
    renderSidebar();
    renderMessages();
    $("input").focus();
  });
  for (const input of document.querySelectorAll(".settings input, .settings select, .settings textarea")) {
    input.addEventListener("change", readSettings);
    input.addEventListener("input", () => {
      if (input.id === "set-custom") readSettings();
    });
  }
  $("reset-settings").addEventListener("click", () => {
    settings = {};
    save(settingsStore, settings);
    renderSettings();
  });
  // Another tab changed the conversations: show them (unless mid-reply).
  window.addEventListener("storage", (ev) => {
    if (streaming || (ev.key !== convStore && ev.key !== null)) return;
    conversations = load(convStore, []);
    renderSidebar();
    renderMessages();
  });
  showModelName().then((id) => (modelID = id));
  showDefaults();
  $("input").focus();
}

init();
