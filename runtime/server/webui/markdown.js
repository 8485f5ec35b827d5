// Markdown for model replies, made safe by construction: marked's lexer
// (vendor/marked.esm.js) turns the text into tokens, and this file builds
// elements from them with createElement and text nodes only. No string is
// ever parsed as HTML, so HTML in a reply (a <script>, an <img onerror>)
// shows as the text it is; links keep only http, https and mailto targets;
// images are never loaded, only named.

import { Lexer } from "./vendor/marked.esm.js";

const lexer = () => new Lexer({ gfm: true, breaks: false });

// renderMarkdown returns a fragment with src rendered. copyCode is called
// with a code block's text when its copy button is pressed.
export function renderMarkdown(src, copyCode) {
  const frag = document.createDocumentFragment();
  let tokens;
  try {
    tokens = lexer().lex(src);
  } catch {
    // The lexer should not throw on any input; if it ever does, the text
    // still shows.
    const p = document.createElement("p");
    p.textContent = src;
    frag.append(p);
    return frag;
  }
  blocks(frag, tokens, copyCode);
  return frag;
}

// safeHref returns href when it is an http, https or mailto URL, else "".
export function safeHref(href) {
  if (typeof href !== "string") return "";
  let u;
  try {
    u = new URL(href, "https://invalid.invalid/");
  } catch {
    return "";
  }
  if (u.origin === "https://invalid.invalid") return ""; // relative: nothing to point at
  return u.protocol === "http:" || u.protocol === "https:" || u.protocol === "mailto:" ? u.href : "";
}

// Entities are decoded for the few a model writes; anything else stays as
// written.
const named = { amp: "&", lt: "<", gt: ">", quot: '"', apos: "'", nbsp: "\u00a0" };

function decodeEntities(s) {
  return s.replace(/&(#x[0-9a-f]{1,6}|#[0-9]{1,7}|[a-z]+);/gi, (m, e) => {
    if (e[0] === "#") {
      const n = e[1] === "x" || e[1] === "X" ? parseInt(e.slice(2), 16) : parseInt(e.slice(1), 10);
      return n > 0 && n <= 0x10ffff && !(n >= 0xd800 && n <= 0xdfff) ? String.fromCodePoint(n) : m;
    }
    return Object.hasOwn(named, e.toLowerCase()) ? named[e.toLowerCase()] : m;
  });
}

function el(tag, className) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  return e;
}

function text(parent, s) {
  parent.append(document.createTextNode(s));
}

function blocks(parent, tokens, copyCode) {
  for (const t of tokens || []) block(parent, t, copyCode);
}

function block(parent, t, copyCode) {
  switch (t.type) {
    case "space":
    case "def":
      return;
    case "heading": {
      const h = el("h" + Math.min(6, Math.max(1, t.depth | 0)));
      inline(h, t.tokens);
      parent.append(h);
      return;
    }
    case "paragraph": {
      const p = el("p");
      inline(p, t.tokens);
      parent.append(p);
      return;
    }
    case "text": {
      // Text at block level: a tight list item's content.
      if (t.tokens) inline(parent, t.tokens);
      else text(parent, decodeEntities(t.text || ""));
      return;
    }
    case "code": {
      parent.append(codeBlock(t.text || "", (t.lang || "").trim().split(/\s+/)[0], copyCode));
      return;
    }
    case "blockquote": {
      const q = el("blockquote");
      blocks(q, t.tokens, copyCode);
      parent.append(q);
      return;
    }
    case "list": {
      const list = el(t.ordered ? "ol" : "ul");
      if (t.ordered && t.start !== "" && Number(t.start) !== 1 && Number.isInteger(Number(t.start))) list.start = Number(t.start);
      for (const item of t.items || []) {
        const li = el("li");
        if (item.task) {
          const box = el("input");
          box.type = "checkbox";
          box.checked = !!item.checked;
          box.disabled = true;
          li.append(box, " ");
          li.className = "task";
        }
        blocks(li, (item.tokens || []).filter((x) => x.type !== "checkbox"), copyCode);
        list.append(li);
      }
      parent.append(list);
      return;
    }
    case "table": {
      const wrap = el("div", "table-wrap");
      const table = el("table");
      const head = el("thead");
      const hr = el("tr");
      (t.header || []).forEach((cell, i) => hr.append(tableCell("th", cell, (t.align || [])[i])));
      head.append(hr);
      const body = el("tbody");
      for (const row of t.rows || []) {
        const tr = el("tr");
        row.forEach((cell, i) => tr.append(tableCell("td", cell, (t.align || [])[i])));
        body.append(tr);
      }
      table.append(head, body);
      wrap.append(table);
      parent.append(wrap);
      return;
    }
    case "hr":
      parent.append(el("hr"));
      return;
    case "html": {
      // Raw HTML is shown as its source.
      const p = el("p", "raw-html");
      text(p, t.raw || t.text || "");
      parent.append(p);
      return;
    }
    default: {
      const p = el("p");
      text(p, t.raw || t.text || "");
      parent.append(p);
    }
  }
}

function tableCell(tag, cell, align) {
  const c = el(tag);
  if (align === "left" || align === "right" || align === "center") c.style.textAlign = align;
  inline(c, cell.tokens);
  return c;
}

function codeBlock(code, lang, copyCode) {
  const box = el("div", "code-block");
  const bar = el("div", "code-bar");
  const label = el("span", "code-lang");
  label.textContent = lang || "text";
  const copy = el("button", "code-copy");
  copy.type = "button";
  copy.textContent = "Copy";
  copy.title = "Copy the code";
  copy.addEventListener("click", () => copyCode && copyCode(code, copy));
  bar.append(label, copy);
  const pre = el("pre");
  const c = el("code");
  if (lang) c.dataset.lang = lang;
  c.textContent = code;
  pre.append(c);
  box.append(bar, pre);
  return box;
}

function inline(parent, tokens) {
  for (const t of tokens || []) {
    switch (t.type) {
      case "text":
        if (t.tokens) inline(parent, t.tokens);
        else text(parent, decodeEntities(t.text || ""));
        break;
      case "escape":
        text(parent, t.text || "");
        break;
      case "strong":
      case "em":
      case "del": {
        const e = el(t.type === "del" ? "del" : t.type);
        inline(e, t.tokens);
        parent.append(e);
        break;
      }
      case "codespan": {
        const c = el("code");
        c.textContent = t.text || "";
        parent.append(c);
        break;
      }
      case "br":
        parent.append(el("br"));
        break;
      case "link": {
        const href = safeHref(t.href);
        if (!href) {
          // Not a link we follow: its text, then the target as text.
          inline(parent, t.tokens);
          if (t.href && t.text !== t.href) text(parent, ` (${t.href})`);
          break;
        }
        const a = el("a");
        a.href = href;
        a.target = "_blank";
        a.rel = "noopener noreferrer nofollow";
        if (t.title) a.title = t.title;
        inline(a, t.tokens);
        parent.append(a);
        break;
      }
      case "image": {
        // Never fetched: a reply must not make the browser load anything.
        const s = el("span", "image-ref");
        s.textContent = `[image: ${t.text || ""}${t.href ? " " + t.href : ""}]`;
        parent.append(s);
        break;
      }
      case "html":
        text(parent, t.raw || t.text || "");
        break;
      default:
        text(parent, t.raw || t.text || "");
    }
  }
}
