// Shared by the chat and machine pages: the API with its key, storage in
// localStorage, and formatting.

const keyStore = "ats.apiKey";

// load reads a JSON value from localStorage (def when absent or broken:
// private windows and full storage must not break the page).
export function load(key, def) {
  try {
    const v = localStorage.getItem(key);
    return v === null ? def : JSON.parse(v);
  } catch {
    return def;
  }
}

export function save(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
    return true;
  } catch {
    return false;
  }
}

export function apiKey() {
  return load(keyStore, "");
}

export function setAPIKey(k) {
  save(keyStore, k || "");
}

// APIError is a response the API refused, with its message.
export class APIError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// errorOf reads the message of an OpenAI-style error response.
export async function errorOf(resp) {
  let msg = `${resp.status} ${resp.statusText}`;
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) msg = body.error.message;
  } catch {
    // not JSON: keep the status line
  }
  if (resp.status === 401) {
    msg += " (set the API key in the settings of the chat page)";
  }
  return new APIError(resp.status, msg);
}

// api calls the server with the API key when one is set. It returns the
// response when it is OK, else throws an APIError.
export async function api(path, opts = {}) {
  const headers = Object.assign({}, opts.headers || {});
  const k = apiKey();
  if (k) headers["Authorization"] = "Bearer " + k;
  const resp = await fetch(path, Object.assign({}, opts, { headers }));
  if (!resp.ok) throw await errorOf(resp);
  return resp;
}

// el makes an element: el("div", {class: "x", text: "hi"}, child, ...).
export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") e.textContent = v;
    else if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) {
    if (c !== null && c !== undefined) e.append(c);
  }
  return e;
}

export function fmtBytes(n) {
  if (n === undefined || n === null || !isFinite(n)) return "not reported";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return (i === 0 ? v.toFixed(0) : v.toFixed(v < 10 ? 2 : 1)) + " " + units[i];
}

export function fmtRate(n, unit) {
  if (n === undefined || n === null || !isFinite(n)) return "not reported";
  return (n >= 100 ? n.toFixed(0) : n.toFixed(1)) + " " + unit;
}

// firstState is the state the server wrote into the page (the model's
// name; on the machine page also the metrics and the placement map), or
// null for a page without it.
export function firstState() {
  const e = document.getElementById("first-state");
  if (!e) return null;
  try {
    const v = JSON.parse(e.textContent);
    return v && typeof v === "object" && v.model ? v : null;
  } catch {
    return null;
  }
}

// copyText puts text on the clipboard and says so on button.
export async function copyText(text, button) {
  let ok = false;
  try {
    await navigator.clipboard.writeText(text);
    ok = true;
  } catch {
    // No clipboard API (an insecure origin): the old way.
    const area = el("textarea", { class: "copy-buffer", readonly: true });
    area.value = text;
    document.body.append(area);
    area.select();
    try {
      ok = document.execCommand("copy");
    } catch {
      ok = false;
    }
    area.remove();
  }
  if (button) {
    const was = button.dataset.label || button.textContent;
    button.dataset.label = was;
    button.textContent = ok ? "Copied" : "Copy failed";
    setTimeout(() => (button.textContent = was), 1500);
  }
  return ok;
}

// showModelName puts the served model's id in the top bar and returns it:
// from the page's first state, or from /v1/models when the server wants a
// key (to say so when none is set).
export async function showModelName() {
  const out = document.getElementById("model-name");
  const st = firstState();
  if (st && !st.key_needed) {
    out.textContent = st.model;
    out.title = "the model this server runs";
    return st.model;
  }
  try {
    const resp = await api("/v1/models");
    const list = await resp.json();
    const id = list.data && list.data[0] ? list.data[0].id : "";
    out.textContent = id;
    out.title = "the model this server runs";
    return id;
  } catch (e) {
    out.textContent = e.status === 401 ? "API key needed" : "server unreachable";
    out.title = e.message;
    out.classList.add("warn");
    return "";
  }
}
