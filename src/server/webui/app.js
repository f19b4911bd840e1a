// The chat page's state and views: conversations kept in localStorage, the settings, and one
// streamed reply at a time (api.js), rendered as Markdown (markdown.js).
import { ApiError, getModel, openChatStream, readEvents } from './api.js';
import { renderMarkdown } from './markdown.js';

const $ = (id) => document.getElementById(id);
const KEYS = { conversations: 'mla.conversations', current: 'mla.current', settings: 'mla.settings', apiKey: 'mla.apiKey' };

function load(key, fallback) {
  try {
    const v = localStorage.getItem(key);
    return v === null ? fallback : JSON.parse(v);
  } catch {
    return fallback;
  }
}
const save = (key, value) => localStorage.setItem(key, JSON.stringify(value));

// A conversation: { id, title, created, messages: [{ role, content, reasoning?, tool_calls?,
// stats?, error?, stopped? }] }; the newest first.
const state = {
  conversations: load(KEYS.conversations, []),
  currentId: load(KEYS.current, null),
  settings: { system: '', temperature: '', top_p: '', max_tokens: '', ...load(KEYS.settings, {}) },
  apiKey: localStorage.getItem(KEYS.apiKey) || '',
  model: '',
  controller: null,  // the AbortController of the reply streaming now
};

function saveConversations() {
  save(KEYS.conversations, state.conversations);
  save(KEYS.current, state.currentId);
}

function current() {
  let conv = state.conversations.find((c) => c.id === state.currentId);
  if (!conv) {
    conv = { id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`, title: '', created: Date.now(), messages: [] };
    state.conversations.unshift(conv);
    state.currentId = conv.id;
  }
  return conv;
}

// Runs fn(key); on a 401 asks for the API key once, keeps it, and runs fn again with it.
async function withKey(fn) {
  try {
    return await fn(state.apiKey);
  } catch (e) {
    if (!(e instanceof ApiError) || e.status !== 401) throw e;
    const key = window.prompt(`${e.message}\n\nAPI key:`, '');
    if (!key) throw e;
    state.apiKey = key.trim();
    localStorage.setItem(KEYS.apiKey, state.apiKey);
    return await fn(state.apiKey);
  }
}

// What a failure says on the page.
function describe(e) {
  if (e instanceof ApiError) {
    if (e.status === 0) return `Server unreachable: ${e.message}`;
    if (e.status === 429) return `The server is busy (429), try again shortly: ${e.message}`;
    return `Error ${e.status}: ${e.message}`;
  }
  return `Error: ${e.message || e}`;
}

function showError(text) {
  $('error').textContent = text || '';
  $('error').hidden = !text;
}

// ---- views ----

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

// The view of one message: its element and update(streaming) that redraws its parts.
function messageView(msg, index) {
  const root = el('div', `message ${msg.role}`);
  const head = el('div', 'role');
  head.append(el('span', '', msg.role));
  root.append(head);
  const view = { root, msg, userToggled: false };
  if (msg.role === 'user') {
    const edit = el('button', 'edit', 'Edit');
    edit.type = 'button';
    edit.onclick = () => startEdit(view, index);
    head.append(edit);
    view.content = el('div', 'content');
    root.append(view.content);
  } else {
    view.reasoning = el('details', 'reasoning');
    view.reasoning.append(el('summary', '', 'Reasoning'));
    view.reasoningText = el('div', 'text');
    view.reasoning.append(view.reasoningText);
    // Once the reader opens or closes it, the page stops doing so.
    view.reasoning.querySelector('summary').addEventListener('click', () => { view.userToggled = true; });
    view.tools = el('div', 'tools');
    view.content = el('div', 'content');
    view.meta = el('div', 'meta');
    root.append(view.reasoning, view.tools, view.content, view.meta);
  }
  view.update = (streaming) => updateView(view, streaming);
  view.update(false);
  return view;
}

function updateView(view, streaming) {
  const msg = view.msg;
  if (msg.role === 'user') {
    view.content.textContent = msg.content;
    return;
  }
  view.reasoning.hidden = !msg.reasoning;
  view.reasoningText.textContent = msg.reasoning || '';
  // Open while the reasoning streams; closed once the answer starts or the reply ends.
  if (!view.userToggled) view.reasoning.open = Boolean(streaming && msg.reasoning && !msg.content);
  view.tools.replaceChildren(...(msg.tool_calls || []).map((t) =>
    el('div', 'tool-call', `${t.function.name || '?'}(${t.function.arguments || ''})`)));
  view.content.innerHTML = renderMarkdown(msg.content || '');  // escaped by renderMarkdown
  const meta = [];
  if (streaming) meta.push('generating…');
  if (msg.stats) meta.push(msg.stats);
  if (msg.stopped) meta.push('stopped');
  view.meta.replaceChildren(meta.join(' · '));
  if (msg.error) view.meta.append(el('div', 'failed', msg.error));
}

function renderConversationList() {
  const list = $('conversations');
  list.replaceChildren(...state.conversations.map((c) => {
    const li = el('li', c.id === state.currentId ? 'current' : '', c.title || 'New chat');
    li.title = c.title || '';
    li.onclick = () => {
      if (state.controller) return;
      state.currentId = c.id;
      saveConversations();
      render();
    };
    return li;
  }));
}

function renderMessages() {
  const conv = current();
  $('messages').replaceChildren(...conv.messages.map((m, i) => messageView(m, i).root));
  scrollToEnd(true);
}

function render() {
  renderConversationList();
  renderMessages();
}

function scrollToEnd(force) {
  const box = $('messages');
  if (force || box.scrollHeight - box.scrollTop - box.clientHeight < 80) box.scrollTop = box.scrollHeight;
}

function setBusy(busy) {
  $('send').hidden = busy;
  $('stop').hidden = !busy;
  $('regenerate').disabled = busy;
  for (const b of document.querySelectorAll('.message .edit')) b.disabled = busy;
}

// ---- generation ----

// The request body: the system prompt, the conversation's text so far (failed empty replies
// left out), the sampling settings that are set.
function requestBody(messages) {
  const s = state.settings;
  const history = [];
  if (s.system.trim()) history.push({ role: 'system', content: s.system });
  for (const m of messages)
    if (m.role === 'user' || m.content) history.push({ role: m.role, content: m.content });
  const body = { messages: history, stream: true, stream_options: { include_usage: true } };
  if (state.model) body.model = state.model;
  if (s.temperature !== '') body.temperature = Number(s.temperature);
  if (s.top_p !== '') body.top_p = Number(s.top_p);
  if (s.max_tokens !== '') body.max_tokens = Number(s.max_tokens);
  return body;
}

// Tool-call deltas carry an index; the first one of an index has its id and name, the rest
// pieces of the arguments.
function mergeToolCalls(calls, deltas) {
  for (const d of deltas) {
    const i = d.index ?? calls.length;
    calls[i] = calls[i] || { id: '', type: 'function', function: { name: '', arguments: '' } };
    if (d.id) calls[i].id = d.id;
    if (d.function && d.function.name) calls[i].function.name += d.function.name;
    if (d.function && d.function.arguments) calls[i].function.arguments += d.function.arguments;
  }
}

function statsText(usage, pieces, firstAt, endAt) {
  const tokens = usage ? usage.completion_tokens : pieces;
  const parts = [`${tokens} tokens`];
  if (firstAt !== null && endAt > firstAt && tokens > 1)
    parts.push(`${((tokens - 1) / ((endAt - firstAt) / 1000)).toFixed(1)} tokens/s`);
  if (usage) {
    const cached = (usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens) || 0;
    parts.push(`prompt ${usage.prompt_tokens} tokens (${cached} cached)`);
  }
  return parts.join(' · ');
}

// Streams the assistant's reply to the conversation's messages onto the page.
async function generate(conv) {
  showError('');
  const body = requestBody(conv.messages);
  const reply = { role: 'assistant', content: '', reasoning: '', tool_calls: [] };
  conv.messages.push(reply);
  const view = messageView(reply, conv.messages.length - 1);
  $('messages').append(view.root);
  scrollToEnd(true);
  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  let usage = null, pieces = 0, firstAt = null, pending = false;
  const redraw = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      if (state.controller === controller) view.update(true), scrollToEnd(false);
    });
  };
  view.update(true);
  try {
    const res = await withKey((key) => openChatStream(body, key, controller.signal));
    for await (const event of readEvents(res)) {
      if (event.usage) usage = event.usage;
      for (const choice of event.choices || []) {
        const d = choice.delta || {};
        if (d.reasoning_content) reply.reasoning += d.reasoning_content;
        if (d.content) reply.content += d.content;
        if (d.tool_calls) mergeToolCalls(reply.tool_calls, d.tool_calls);
        if (d.reasoning_content || d.content || d.tool_calls) {
          ++pieces;
          if (firstAt === null) firstAt = performance.now();
        }
        if (choice.finish_reason) reply.finish_reason = choice.finish_reason;
      }
      redraw();
    }
  } catch (e) {
    if (e.name === 'AbortError') reply.stopped = true;
    else {
      reply.error = describe(e);
      showError(reply.error);
    }
  } finally {
    state.controller = null;
    reply.stats = statsText(usage, pieces, firstAt, performance.now());
    saveConversations();
    view.update(false);
    setBusy(false);
    scrollToEnd(false);
  }
}

async function send(text) {
  if (state.controller || !text.trim()) return;
  const conv = current();
  conv.messages.push({ role: 'user', content: text });
  if (!conv.title) conv.title = text.trim().slice(0, 48);
  saveConversations();
  render();
  await generate(conv);
}

function regenerate() {
  if (state.controller) return;
  const conv = current();
  while (conv.messages.length && conv.messages[conv.messages.length - 1].role === 'assistant') conv.messages.pop();
  if (!conv.messages.length) return;
  saveConversations();
  renderMessages();
  generate(conv);
}

// Edit a user message in place: sending it drops everything after it and generates again.
function startEdit(view, index) {
  if (state.controller) return;
  const box = el('textarea');
  box.value = view.msg.content;
  box.rows = Math.min(12, view.msg.content.split('\n').length + 1);
  const ok = el('button', '', 'Send'), cancel = el('button', '', 'Cancel');
  ok.type = cancel.type = 'button';
  view.content.replaceChildren(box, ok, cancel);
  box.focus();
  cancel.onclick = () => view.update(false);
  ok.onclick = () => {
    const conv = current();
    if (!box.value.trim()) return;
    conv.messages = conv.messages.slice(0, index);
    conv.messages.push({ role: 'user', content: box.value });
    saveConversations();
    renderMessages();
    generate(conv);
  };
}

// ---- controls ----

function bindSettings() {
  const fields = { 'system-prompt': 'system', temperature: 'temperature', 'top-p': 'top_p', 'max-tokens': 'max_tokens' };
  for (const [id, key] of Object.entries(fields)) {
    $(id).value = state.settings[key];
    $(id).addEventListener('input', () => {
      state.settings[key] = $(id).value;
      save(KEYS.settings, state.settings);
    });
  }
  $('settings-toggle').onclick = () => {
    $('settings').hidden = !$('settings').hidden;
    $('settings-toggle').setAttribute('aria-expanded', String(!$('settings').hidden));
  };
}

function exportConversation() {
  const conv = current();
  const blob = new Blob([JSON.stringify(conv, null, 2)], { type: 'application/json' });
  const a = el('a');
  a.href = URL.createObjectURL(blob);
  a.download = `${(conv.title || 'chat').replace(/[^\w.-]+/g, '_').slice(0, 40)}-${conv.id}.json`;
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

function bindControls() {
  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    const text = $('input').value;
    if (state.controller || !text.trim()) return;
    $('input').value = '';
    send(text);
  });
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $('composer').requestSubmit();
    }
  });
  $('stop').onclick = () => state.controller && state.controller.abort();
  $('regenerate').onclick = regenerate;
  $('new-chat').onclick = () => {
    if (state.controller) return;
    if (current().messages.length) state.currentId = null;
    current();
    saveConversations();
    render();
    $('input').focus();
  };
  $('delete-chat').onclick = () => {
    if (state.controller) return;
    state.conversations = state.conversations.filter((c) => c.id !== state.currentId);
    state.currentId = state.conversations.length ? state.conversations[0].id : null;
    current();
    saveConversations();
    render();
  };
  $('export-chat').onclick = exportConversation;
}

async function showModel() {
  try {
    const m = await withKey((key) => getModel(key));
    state.model = m.id;
    $('model').textContent = m.maxModelLen ? `${m.id} · context ${m.maxModelLen} tokens` : m.id;
  } catch (e) {
    $('model').textContent = 'no model';
    showError(describe(e));
  }
}

bindSettings();
bindControls();
render();
showModel();
$('input').focus();
