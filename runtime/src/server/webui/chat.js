// modelc's chat page (runtime/src/server/webui.rs serves it at the server's root).
//
// - The API is reached by paths relative to the page, so `--api-prefix /p` (page at /p/)
//   talks to /p/v1/chat/completions; nothing is fetched from anywhere else.
// - Answers stream over /v1/chat/completions' server-sent events; Stop aborts the fetch
//   (the server cancels a request whose client went away and frees its slot).
// - Conversations, settings and the API key live in localStorage. A conversation exports
//   as {"messages": [...]} in OpenAI's format, as `modelc repl`'s /save writes.
// - Markdown is rendered from text escaped first: no HTML of the model's reaches the page.
"use strict";

const $ = (id) => document.getElementById(id);
const KEYS = {
  convs: "modelc.conversations",
  current: "modelc.current",
  settings: "modelc.settings",
  apiKey: "modelc.apiKey",
};
// The request fields the settings dialog sets, and how each is read from its input.
const NUMBER_FIELDS = {
  temperature: Number, top_k: parseInt, top_p: Number, min_p: Number,
  repeat_penalty: Number, seed: parseInt, max_tokens: parseInt,
};

// ---------------------------------------------------------------- storage

function load(key, fallback) {
  try {
    const v = localStorage.getItem(key);
    return v === null ? fallback : JSON.parse(v);
  } catch (e) {
    return fallback;
  }
}

function store(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch (e) {
    setStatus("Could not save in this browser: " + e.message, true);
  }
}

const state = {
  convs: load(KEYS.convs, []),        // [{id, name, system, messages: [{role, content}], updated}]
  current: load(KEYS.current, null),  // the id of the conversation shown
  settings: load(KEYS.settings, {}),  // field -> string as typed
  apiKey: load(KEYS.apiKey, ""),
  busy: null,                         // {controller} while an answer streams
  nCtx: 0,
  shown: null,                        // the id of the conversation last rendered
};

function saveConvs() {
  store(KEYS.convs, state.convs);
  store(KEYS.current, state.current);
}

function conv() {
  let c = state.convs.find((c) => c.id === state.current);
  if (!c) {
    c = newConv();
  }
  return c;
}

function newConv(name, messages, system) {
  const c = {
    id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8),
    name: name || "New chat",
    system: system !== undefined ? system : state.settings.system || "",
    messages: messages || [],
    updated: Date.now(),
  };
  state.convs.unshift(c);
  state.current = c.id;
  saveConvs();
  return c;
}

// ---------------------------------------------------------------- markdown

function escapeHtml(s) {
  return s.replace(/[&<>"']/g, (ch) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;",
  })[ch]);
}

// Inline Markdown on text already escaped: code spans, bold, italics, strike-through,
// links (http(s) only; images become links, so that nothing is loaded).
function inline(t) {
  const spans = [];
  t = t.replace(/`([^`\n]+)`/g, (m, c) => {
    spans.push("<code>" + c + "</code>");
    return "\u0001" + (spans.length - 1) + "\u0002";
  });
  t = t
    .replace(/!?\[([^\]\n]*)\]\((https?:\/\/[^\s)]+)\)/g,
      '<a href="$2" target="_blank" rel="noopener noreferrer">$1</a>')
    .replace(/\*\*([^*\n]+?)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^\w])__([^_\n]+?)__(?!\w)/g, "$1<strong>$2</strong>")
    .replace(/(^|[^*\w])\*(?!\s)([^*\n]+?)\*(?!\w)/g, "$1<em>$2</em>")
    .replace(/(^|[^\w])_(?!\s)([^_\n]+?)_(?!\w)/g, "$1<em>$2</em>")
    .replace(/~~([^~\n]+)~~/g, "<del>$1</del>");
  return t.replace(/\u0001(\d+)\u0002/g, (m, i) => spans[+i]);
}

const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([^`\s]*)/;
const LIST = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const TABLE_RULE = /^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$/;

function cells(line) {
  return line.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((c) => inline(c.trim()));
}

// Block Markdown: fenced code (with a copy button; an unclosed fence runs to the end, as
// while it streams), headings, rules, quotes, lists, tables, paragraphs.
function renderMarkdown(src) {
  const lines = escapeHtml(src.replace(/[\u0001\u0002]/g, "")).split("\n");
  const out = [];
  let i = 0;
  const starts = (l) => FENCE.test(l) || /^#{1,6}\s/.test(l) || /^&gt;/.test(l) || LIST.test(l);
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if ((m = FENCE.exec(line))) {
      const fence = m[1];
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trim().startsWith(fence)) {
        body.push(lines[i++]);
      }
      i++;
      out.push('<div class="code"><div class="code-head"><span>' + (m[2] || "text") +
        '</span><button type="button" class="copy">Copy</button></div><pre><code>' +
        body.join("\n") + "</code></pre></div>");
    } else if ((m = /^(#{1,6})\s+(.*)$/.exec(line))) {
      const n = m[1].length;
      out.push("<h" + n + ">" + inline(m[2]) + "</h" + n + ">");
      i++;
    } else if (/^\s{0,3}([-*_])(\s*\1){2,}\s*$/.test(line)) {
      out.push("<hr>");
      i++;
    } else if (/^&gt;/.test(line)) {
      const quote = [];
      while (i < lines.length && /^&gt;/.test(lines[i])) {
        quote.push(lines[i++].replace(/^&gt;\s?/, ""));
      }
      // The quote's text was escaped once already: undo it before rendering it again.
      const raw = quote.join("\n").replace(/&(lt|gt|quot|#39|amp);/g, (e, n) =>
        ({ lt: "<", gt: ">", quot: '"', "#39": "'", amp: "&" })[n]);
      out.push("<blockquote>" + renderMarkdown(raw) + "</blockquote>");
    } else if ((m = LIST.exec(line))) {
      const ordered = /\d/.test(m[2]);
      const items = [];
      while (i < lines.length) {
        const li = LIST.exec(lines[i]);
        if (li && /\d/.test(li[2]) === ordered) {
          items.push(inline(li[3]));
        } else if (lines[i].trim() !== "" && /^\s+/.test(lines[i]) && items.length) {
          items[items.length - 1] += "<br>" + inline(lines[i].trim());
        } else {
          break;
        }
        i++;
      }
      const tag = ordered ? "ol" : "ul";
      const start = ordered && parseInt(m[2], 10) !== 1 ? ' start="' + parseInt(m[2], 10) + '"' : "";
      out.push("<" + tag + start + ">" + items.map((t) => "<li>" + t + "</li>").join("") + "</" + tag + ">");
    } else if (line.includes("|") && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1])) {
      const head = cells(line);
      i += 2;
      const rows = [];
      while (i < lines.length && lines[i].includes("|") && lines[i].trim() !== "") {
        rows.push(cells(lines[i++]));
      }
      out.push("<table><thead><tr>" + head.map((c) => "<th>" + c + "</th>").join("") +
        "</tr></thead><tbody>" + rows.map((r) => "<tr>" + r.map((c) => "<td>" + c + "</td>").join("") +
        "</tr>").join("") + "</tbody></table>");
    } else if (line.trim() === "") {
      i++;
    } else {
      const para = [];
      while (i < lines.length && lines[i].trim() !== "" && (para.length === 0 || !starts(lines[i]))) {
        para.push(inline(lines[i++]));
      }
      out.push("<p>" + para.join("<br>") + "</p>");
    }
  }
  return out.join("");
}

// ---------------------------------------------------------------- view

function setStatus(text, error) {
  const s = $("status");
  s.textContent = text;
  s.classList.toggle("error", !!error);
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function button(label, title, onclick) {
  const b = el("button", "", label);
  b.type = "button";
  b.title = title;
  b.addEventListener("click", onclick);
  return b;
}

function renderList() {
  const list = $("conv-list");
  list.replaceChildren();
  for (const c of state.convs) {
    const li = el("li", c.id === state.current ? "current" : "");
    const open = button(c.name, c.name, () => {
      if (state.busy) return;
      state.current = c.id;
      saveConvs();
      $("sidebar").classList.remove("shown");
      setStatus("");
      render();
    });
    open.className = "open";
    const del = button("\u00d7", "Delete this conversation", () => {
      if (state.busy && c.id === state.current) return;
      if (!confirm('Delete "' + c.name + '"?')) return;
      state.convs = state.convs.filter((x) => x.id !== c.id);
      if (state.current === c.id) state.current = state.convs.length ? state.convs[0].id : null;
      saveConvs();
      render();
    });
    del.className = "delete";
    del.setAttribute("aria-label", "Delete " + c.name);
    li.append(open, del);
    list.append(li);
  }
}

// One message's element; the last user message can be edited, the last answer regenerated.
function messageView(m, index, c) {
  const div = el("div", "msg " + m.role);
  const who = el("div", "who");
  who.append(el("span", "", m.role === "user" ? "You" : "Assistant"), el("span", "spacer"));
  const last = index === c.messages.length - 1;
  const body = el("div", "body");
  if (m.role === "assistant") {
    body.innerHTML = renderMarkdown(m.content);
    if (last && !state.busy) who.append(button("Regenerate", "Answer the last message again", regenerate));
  } else {
    body.textContent = m.content;
    const lastUser = c.messages.map((x) => x.role).lastIndexOf("user") === index;
    if (lastUser && !state.busy) who.append(button("Edit", "Edit this message and send it again", () => edit(div, index)));
  }
  who.append(button("Copy", "Copy this message's text", () => copy(m.content)));
  div.append(who, body);
  if (m.stats) div.append(el("div", "stats", m.stats));
  return div;
}

function render() {
  const c = conv();
  $("conv-name").value = c.name;
  $("system").value = c.system || "";
  // Another conversation shown: its system prompt open if it has one.
  if (state.shown !== c.id) $("system-box").open = !!c.system;
  state.shown = c.id;
  const box = $("messages");
  box.replaceChildren(...c.messages.map((m, i) => messageView(m, i, c)));
  box.scrollTop = box.scrollHeight;
  renderList();
  $("send").hidden = !!state.busy;
  $("stop").hidden = !state.busy;
}

function edit(div, index) {
  const c = conv();
  const area = el("textarea", "edit");
  area.value = c.messages[index].content;
  const send = button("Send", "Replace the message and answer it again", () => {
    const text = area.value.trim();
    if (!text) return;
    c.messages = c.messages.slice(0, index);
    c.messages.push({ role: "user", content: text });
    ask(c);
  });
  const cancel = button("Cancel", "Keep the message as it was", render);
  area.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send.click();
    } else if (e.key === "Escape") {
      render();
    }
  });
  const bar = el("div", "who");
  bar.append(el("span", "spacer"), cancel, send);
  div.replaceChildren(area, bar);
  area.focus();
}

function regenerate() {
  const c = conv();
  if (state.busy || !c.messages.length) return;
  if (c.messages[c.messages.length - 1].role === "assistant") c.messages.pop();
  ask(c);
}

async function copy(text) {
  try {
    await navigator.clipboard.writeText(text);
    setStatus("Copied.");
  } catch (e) {
    const t = el("textarea");
    t.value = text;
    document.body.append(t);
    t.select();
    document.execCommand("copy");
    t.remove();
    setStatus("Copied.");
  }
}

// ---------------------------------------------------------------- server

function headers() {
  const h = { "Content-Type": "application/json" };
  if (state.apiKey) h.Authorization = "Bearer " + state.apiKey;
  return h;
}

// Asks for the API key (once: it is kept) and resolves when one was given.
function askKey() {
  const d = $("key-dialog");
  if (d.open) return Promise.resolve();
  $("key-input").value = state.apiKey || "";
  d.showModal();
  return new Promise((resolve) => {
    d.addEventListener("close", () => {
      state.apiKey = $("key-input").value.trim();
      store(KEYS.apiKey, state.apiKey);
      resolve();
    }, { once: true });
  });
}

async function api(path, options) {
  for (;;) {
    const r = await fetch(path, { ...options, headers: headers() });
    if (r.status !== 401) return r;
    setStatus("This server needs an API key.", true);
    await askKey();
  }
}

async function errorText(r) {
  try {
    const j = await r.json();
    return (j.error && j.error.message) || JSON.stringify(j);
  } catch (e) {
    return r.status + " " + r.statusText;
  }
}

// The model's name and context size (/props), once the model is loaded.
async function loadInfo() {
  for (;;) {
    let r;
    try {
      r = await api("props", { method: "GET" });
    } catch (e) {
      setStatus("Cannot reach the server: " + e.message, true);
      return;
    }
    if (r.status === 503) {
      setStatus("Loading the model\u2026");
      await new Promise((ok) => setTimeout(ok, 1000));
      continue;
    }
    if (!r.ok) {
      setStatus(await errorText(r), true);
      return;
    }
    const p = await r.json();
    const name = (p.model_alias || p.model_path || "").split("/").pop();
    state.nCtx = (p.default_generation_settings && p.default_generation_settings.n_ctx) || 0;
    $("model-info").textContent = name + (state.nCtx ? " \u00b7 ctx " + state.nCtx : "");
    document.title = name + " \u2013 modelc";
    setStatus("");
    return;
  }
}

// The request body: the conversation with its system prompt, the sampler settings.
function requestBody(c) {
  const body = { messages: [], stream: true };
  if (c.system && c.system.trim()) body.messages.push({ role: "system", content: c.system });
  for (const m of c.messages) body.messages.push({ role: m.role, content: m.content });
  const s = state.settings;
  for (const [k, read] of Object.entries(NUMBER_FIELDS)) {
    const v = s[k] !== undefined && String(s[k]).trim() !== "" ? read(s[k], 10) : NaN;
    if (Number.isFinite(v)) body[k] = v;
  }
  if (s.json_schema && s.json_schema.trim()) body.json_schema = JSON.parse(s.json_schema);
  if (s.grammar && s.grammar.trim()) body.grammar = s.grammar;
  return body;
}

function stats(t) {
  if (!t) return "";
  const f = (x) => (x || 0).toFixed(1);
  return t.prompt_n + " prompt tokens at " + f(t.prompt_per_second) + " t/s \u00b7 " +
    t.predicted_n + " tokens at " + f(t.predicted_per_second) + " t/s";
}

// Streams the answer to the conversation's last message into a new assistant message.
async function ask(c) {
  let body;
  try {
    body = requestBody(c);
  } catch (e) {
    setStatus("The JSON schema in Settings is not JSON: " + e.message, true);
    render();
    return;
  }
  const answer = { role: "assistant", content: "" };
  c.messages.push(answer);
  c.updated = Date.now();
  if (c.name === "New chat") {
    const first = c.messages.find((m) => m.role === "user");
    if (first) c.name = first.content.slice(0, 40).replace(/\s+/g, " ");
  }
  const controller = new AbortController();
  state.busy = { controller };
  saveConvs();
  render();
  setStatus("");
  const view = $("messages").lastElementChild.querySelector(".body");
  let error = "";
  let stopped = false;
  try {
    const r = await api("v1/chat/completions", {
      method: "POST", body: JSON.stringify(body), signal: controller.signal,
    });
    if (!r.ok) throw new Error(await errorText(r));
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    let done = false;
    while (!done) {
      const { value, done: end } = await reader.read();
      if (end) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") {
            done = true;
            continue;
          }
          const j = JSON.parse(data);
          if (j.error) throw new Error(j.error.message || JSON.stringify(j.error));
          const delta = j.choices && j.choices[0] && j.choices[0].delta;
          if (delta && typeof delta.content === "string") answer.content += delta.content;
          if (j.timings) answer.stats = stats(j.timings);
        }
      }
      view.innerHTML = renderMarkdown(answer.content);
      const box = $("messages");
      box.scrollTop = box.scrollHeight;
    }
  } catch (e) {
    if (e.name === "AbortError") {
      stopped = true;
    } else {
      error = e.message;
    }
  }
  state.busy = null;
  if (!answer.content && (error || stopped)) c.messages.pop();
  if (stopped) answer.stats = (answer.stats ? answer.stats + " \u00b7 " : "") + "stopped";
  saveConvs();
  render();
  if (error) setStatus(error, true);
  else if (stopped) setStatus("Stopped.");
  else setStatus(answer.stats || "");
}

// ---------------------------------------------------------------- settings

function openSettings() {
  const f = $("settings-form");
  for (const input of f.querySelectorAll("input, textarea")) {
    input.value = state.settings[input.name] !== undefined ? state.settings[input.name] : "";
  }
  $("settings-error").textContent = "";
  $("settings").showModal();
}

function saveSettings(e) {
  const f = $("settings-form");
  const next = {};
  for (const input of f.querySelectorAll("input, textarea")) {
    if (input.value.trim() !== "") next[input.name] = input.value;
  }
  if (next.json_schema) {
    try {
      JSON.parse(next.json_schema);
    } catch (err) {
      e.preventDefault();
      $("settings-error").textContent = "The JSON schema is not JSON: " + err.message;
      return;
    }
  }
  state.settings = next;
  store(KEYS.settings, next);
}

// ---------------------------------------------------------------- import / export

function exportConv() {
  const c = conv();
  const messages = [];
  if (c.system && c.system.trim()) messages.push({ role: "system", content: c.system });
  for (const m of c.messages) messages.push({ role: m.role, content: m.content });
  const blob = new Blob([JSON.stringify({ messages }, null, 2) + "\n"], { type: "application/json" });
  const a = el("a");
  a.href = URL.createObjectURL(blob);
  a.download = (c.name.replace(/[^\w.-]+/g, "_") || "conversation") + ".json";
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

// Reads {"messages": [...]} or a bare list of {"role", "content"} (`modelc repl`'s /load).
function importConv(file) {
  const reader = new FileReader();
  reader.onload = () => {
    try {
      const v = JSON.parse(reader.result);
      const list = Array.isArray(v) ? v : v && v.messages;
      if (!Array.isArray(list)) throw new Error('expected {"messages": [...]}');
      list.forEach((m, i) => {
        if (!m || typeof m.role !== "string" || typeof m.content !== "string") {
          throw new Error("message " + i + " needs a string role and content");
        }
      });
      let system = "";
      let messages = list.map((m) => ({ role: m.role, content: m.content }));
      if (messages.length && messages[0].role === "system") system = messages.shift().content;
      newConv(file.name.replace(/\.json$/i, ""), messages, system);
      render();
      setStatus("Imported " + list.length + " messages.");
    } catch (e) {
      setStatus(file.name + ": " + e.message, true);
    }
  };
  reader.readAsText(file);
}

// ---------------------------------------------------------------- events

function send() {
  const input = $("input");
  const text = input.value.trim();
  if (!text || state.busy) return;
  input.value = "";
  const c = conv();
  c.messages.push({ role: "user", content: text });
  ask(c);
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  send();
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    send();
  } else if (e.key === "Escape" && state.busy) {
    state.busy.controller.abort();
  }
});
$("stop").addEventListener("click", () => state.busy && state.busy.controller.abort());
$("new-chat").addEventListener("click", () => {
  if (state.busy) return;
  newConv();
  render();
  $("sidebar").classList.remove("shown");
  $("input").focus();
});
$("conv-name").addEventListener("change", (e) => {
  conv().name = e.target.value.trim() || "Untitled";
  saveConvs();
  renderList();
});
$("system").addEventListener("input", (e) => {
  conv().system = e.target.value;
  saveConvs();
});
$("toggle-sidebar").addEventListener("click", () => $("sidebar").classList.toggle("shown"));
$("open-settings").addEventListener("click", openSettings);
$("settings-save").addEventListener("click", saveSettings);
$("settings-reset").addEventListener("click", () => {
  for (const input of $("settings-form").querySelectorAll("input, textarea")) input.value = "";
});
$("export").addEventListener("click", exportConv);
$("import").addEventListener("change", (e) => {
  if (e.target.files.length) importConv(e.target.files[0]);
  e.target.value = "";
});
$("messages").addEventListener("click", (e) => {
  const b = e.target.closest("button.copy");
  if (b) copy(b.closest(".code").querySelector("code").textContent);
});

render();
$("input").focus();
loadInfo();
