// The chat page of `mla serve` (GET /, src/server/webui/) in a real browser: Debian's Chromium,
// headless, driven by puppeteer-core. Run by tests/server/test_webui_e2e.cpp, which starts two
// servers on a tiny random-weight checkpoint and passes their addresses:
//   WEBUI_URL        DeepSeek-V3's chat template
//   WEBUI_THINK_URL  the same template opening <think> (--reasoning-parser deepseek_r1)
//   WEBUI_KEY_URL    DeepSeek-V3's chat template behind --api-key WEBUI_API_KEY
//   WEBUI_SCREENSHOT (optional) where to write a PNG of the page
//   CHROMIUM         (optional) the browser, default /usr/bin/chromium
// The model is random: the checks look at the page's structure and the requests it makes, not
// at what the model says. Prints one line per check and exits non-zero if any failed.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import puppeteer from 'puppeteer-core';
import { assert, check, equal, finish } from './harness.mjs';

const url = process.env.WEBUI_URL, thinkUrl = process.env.WEBUI_THINK_URL;
const keyUrl = process.env.WEBUI_KEY_URL, apiKey = process.env.WEBUI_API_KEY;
if (!url || !thinkUrl || !keyUrl || !apiKey) {
  console.error('WEBUI_URL, WEBUI_THINK_URL, WEBUI_KEY_URL and WEBUI_API_KEY must be set');
  process.exit(2);
}


const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'mla-webui-'));
const browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  userDataDir: profile,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  defaultViewport: { width: 1200, height: 800 },
});

// A page on the server at base, recording console errors, every request to another origin
// (refused), and the chat requests it sends; before(page) runs before it loads.
async function openPage(base, before = async () => {}) {
  const page = await browser.newPage();
  await before(page);
  const origin = new URL(base).origin;
  const seen = { errors: [], foreign: [], chats: [], chatHeaders: [] };
  page.on('console', (m) => { if (m.type() === 'error') seen.errors.push(m.text()); });
  page.on('pageerror', (e) => seen.errors.push(String(e)));
  await page.setRequestInterception(true);
  page.on('request', (r) => {
    const u = r.url();
    if (u.startsWith('data:') || u.startsWith('blob:')) return r.continue();
    if (new URL(u).origin !== origin) {
      seen.foreign.push(u);
      return r.abort();
    }
    if (r.method() === 'POST' && new URL(u).pathname === '/v1/chat/completions') {
      seen.chats.push(JSON.parse(r.postData()));
      seen.chatHeaders.push(r.headers());
    }
    return r.continue();
  });
  await page.goto(base + '/', { waitUntil: 'networkidle0' });
  await page.waitForFunction(() => /context \d+ tokens/.test(document.getElementById('model').textContent));
  return { page, seen };
}

async function setMaxTokens(page, n) {
  if (await page.$eval('#settings', (e) => e.hidden)) await page.click('#settings-toggle');
  await page.click('#max-tokens', { clickCount: 3 });
  await page.type('#max-tokens', String(n));
}

// Types text into the composer and presses Enter.
async function sendWithEnter(page, text) {
  await page.click('#input');
  await page.type('#input', text);
  await page.keyboard.press('Enter');
}

// Waits for the last reply to end; its stored message.
async function lastReplyDone(page) {
  await page.waitForFunction(() => !document.getElementById('stop').hidden, { timeout: 5000 }).catch(() => {});
  await page.waitForFunction(() => document.getElementById('stop').hidden, { timeout: 60000 });
  return page.evaluate(() => {
    const convs = JSON.parse(localStorage.getItem('mla.conversations'));
    const conv = convs.find((c) => c.id === JSON.parse(localStorage.getItem('mla.current')));
    return conv.messages[conv.messages.length - 1];
  });
}

async function clientGoneCount() {
  const text = await (await fetch(url + '/metrics')).text();
  const m = /mla_http_cut_total\{reason="client_gone"\} (\d+)/.exec(text);
  assert(m, 'no client_gone counter in /metrics');
  return Number(m[1]);
}

const { page, seen } = await openPage(url);

await check('the page loads from the server alone, without console errors', async () => {
  assert((await page.title()).includes('mla'), `title: ${await page.title()}`);
  assert(seen.foreign.length === 0, `requests to other origins: ${seen.foreign.join(', ')}`);
  assert(seen.errors.length === 0, `console errors: ${seen.errors.join(' | ')}`);
});

let first;
await check('Enter sends a message and the reply streams onto the page', async () => {
  await setMaxTokens(page, 12);
  // Streaming: the reply's element carries the "generating" mark while it streams. Twelve
  // tokens of the tiny model can end before a check made after Enter runs, so an observer set
  // up beforehand records the mark whenever it appears.
  await page.evaluate(() => {
    window.sawGenerating = false;
    new MutationObserver(() => {
      const m = document.querySelector('.message.assistant:last-child .meta');
      if (m && m.textContent.includes('generating')) window.sawGenerating = true;
    }).observe(document.body, { subtree: true, childList: true, characterData: true });
  });
  await sendWithEnter(page, 'Hello there');
  await page.waitForFunction(() => window.sawGenerating, { timeout: 10000 });
  first = await lastReplyDone(page);
  assert(!first.error, `reply failed: ${first.error}`);
  assert(first.content.length + first.reasoning.length + first.tool_calls.length > 0, 'empty reply');
  const body = seen.chats[0];
  assert(body.stream === true && body.stream_options.include_usage === true, `body: ${JSON.stringify(body)}`);
  assert(body.max_tokens === 12, `max_tokens ${body.max_tokens}`);
  assert(body.messages.length === 1 && body.messages[0].content === 'Hello there', JSON.stringify(body.messages));
  const meta = await page.$eval('.message.assistant:last-child .meta', (e) => e.textContent);
  assert(/\d+ tokens/.test(meta) && /prompt \d+ tokens \(\d+ cached\)/.test(meta), `meta: ${meta}`);
  const users = await page.$$eval('.message.user .content', (es) => es.map((e) => e.textContent));
  assert(users.length === 1 && users[0] === 'Hello there', JSON.stringify(users));
});

await check('a second turn carries the first in its history', async () => {
  await sendWithEnter(page, 'And again');
  const reply = await lastReplyDone(page);
  assert(!reply.error, `reply failed: ${reply.error}`);
  const body = seen.chats[1];
  const expected = first.content ? 3 : 2;  // a reply without text is left out of the history
  assert(body.messages.length === expected, `history of ${body.messages.length}: ${JSON.stringify(body.messages)}`);
  assert(body.messages[0].content === 'Hello there' && body.messages[expected - 1].content === 'And again',
    JSON.stringify(body.messages));
  if (first.content) assert(body.messages[1].role === 'assistant' && body.messages[1].content === first.content, 'first reply');
});

await check('Stop cancels the reply and the server counts the client gone', async () => {
  await setMaxTokens(page, 3000);
  // Stop is clicked from inside the page as soon as the reply shows text. A random model can
  // still end its reply first (an early end of sequence, before or just after the click, when
  // the server has nothing left to cancel), so up to four tries.
  let reply, before, after, attempt;
  for (attempt = 1; attempt <= 4; ++attempt) {
    before = after = await clientGoneCount();
    await page.evaluate(() => {
      if (window.stopWhenStreaming) window.stopWhenStreaming.disconnect();
      window.stopWhenStreaming = new MutationObserver(() => {
        const m = document.querySelector('.message.assistant:last-child');
        const text = m && m.querySelector('.content').textContent + m.querySelector('.reasoning .text').textContent;
        if (text && !document.getElementById('stop').hidden) {
          window.stopWhenStreaming.disconnect();
          document.getElementById('stop').click();
        }
      });
      window.stopWhenStreaming.observe(document.getElementById('messages'), { childList: true, subtree: true, characterData: true });
    });
    await sendWithEnter(page, 'Tell me a long story');
    reply = await lastReplyDone(page);
    assert(!reply.error, `reply failed: ${reply.error}`);
    if (!reply.stopped) continue;
    for (let i = 0; i < 30 && after <= before; ++i) {
      await new Promise((r) => setTimeout(r, 100));
      after = await clientGoneCount();
    }
    if (after > before) break;
    console.log(`# try ${attempt}: ${reply.stopped ? 'stopped, but the server had finished' : 'the reply ended first'}`);
  }
  assert(reply.stopped === true, `not stopped: ${JSON.stringify(reply).slice(0, 300)}`);
  assert(after > before, `client_gone stayed at ${before}`);
  const meta = await page.$eval('.message.assistant:last-child .meta', (e) => e.textContent);
  assert(meta.includes('stopped'), `meta: ${meta}`);
});

await check('a reload keeps the conversation', async () => {
  const before = await page.$$eval('.message', (es) => es.map((e) => e.className + ':' + e.querySelector('.content').textContent));
  await page.reload({ waitUntil: 'networkidle0' });
  const after = await page.$$eval('.message', (es) => es.map((e) => e.className + ':' + e.querySelector('.content').textContent));
  assert(after.length >= 6, `${after.length} messages after the reload`);
  assert(JSON.stringify(before) === JSON.stringify(after), 'the messages changed');
  assert(await page.$eval('#max-tokens', (e) => e.value) === '3000', 'settings were not kept');
});

await check('Regenerate replaces the last reply; an edited message drops what followed it', async () => {
  await setMaxTokens(page, 8);
  const count = await page.$$eval('.message', (es) => es.length);
  const sent = seen.chats.length;
  await page.click('#regenerate');
  let reply = await lastReplyDone(page);
  assert(!reply.error, `reply failed: ${reply.error}`);
  assert(await page.$$eval('.message', (es) => es.length) === count, 'regenerate changed the number of messages');
  const regen = seen.chats[sent];
  assert(regen && regen.messages[regen.messages.length - 1].role === 'user', `history: ${JSON.stringify(regen && regen.messages)}`);
  await page.click('.message.user .edit');
  await page.$eval('.message.user textarea', (t) => { t.value = 'Edited question'; });
  await page.evaluate(() => [...document.querySelectorAll('.message.user button')].find((b) => b.textContent === 'Send').click());
  reply = await lastReplyDone(page);
  assert(!reply.error, `reply failed: ${reply.error}`);
  const edited = seen.chats[seen.chats.length - 1];
  assert(edited.messages.length === 1 && edited.messages[0].content === 'Edited question', JSON.stringify(edited.messages));
  const roles = await page.$$eval('.message', (es) => es.map((e) => e.className));
  assert(roles.length === 2 && roles[0].includes('user') && roles[1].includes('assistant'), JSON.stringify(roles));
});

await check('the reasoning block is open while it streams, then closes and toggles', async () => {
  const { page: think, seen: thinkSeen } = await openPage(thinkUrl);
  await setMaxTokens(think, 400);
  // An observer in the page notes the block open with text while the reply streams. A random
  // model can end its reply before the page draws it once (an early end of sequence), so up
  // to three tries.
  let reply, sawOpen = false;
  for (let attempt = 1; attempt <= 3 && !sawOpen; ++attempt) {
    await think.evaluate(() => {
      window.sawOpen = false;
      new MutationObserver(() => {
        const d = document.querySelector('.message.assistant:last-child details.reasoning');
        if (d && !d.hidden && d.open && d.querySelector('.text').textContent.length > 0 &&
            !document.getElementById('stop').hidden) window.sawOpen = true;
      }).observe(document.getElementById('messages'), { childList: true, subtree: true, characterData: true, attributes: true });
    });
    await sendWithEnter(think, 'Think first');
    reply = await lastReplyDone(think);
    assert(!reply.error, `reply failed: ${reply.error}`);
    sawOpen = await think.evaluate(() => window.sawOpen);
    if (!sawOpen) console.log(`# try ${attempt}: the reply ended before it was drawn open`);
  }
  assert(sawOpen, 'the reasoning block was never open while streaming');
  assert(reply.reasoning.length > 0, 'no reasoning_content');
  const open = () => think.$eval('.message.assistant:last-child details.reasoning', (d) => d.open);
  assert(!(await open()), 'the reasoning block stayed open after the reply');
  await think.click('.message.assistant:last-child details.reasoning summary');
  assert(await open(), 'a click did not open it');
  if (process.env.WEBUI_SCREENSHOT) {
    await think.click('#settings-toggle');  // the settings folded away for the picture
    await think.screenshot({ path: process.env.WEBUI_SCREENSHOT });
  }
  await think.click('.message.assistant:last-child details.reasoning summary');
  assert(!(await open()), 'a second click did not close it');
  assert(thinkSeen.foreign.length === 0 && thinkSeen.errors.length === 0,
    `foreign: ${thinkSeen.foreign} errors: ${thinkSeen.errors}`);
});

await check('behind an API key the page asks for it once, keeps it and sends it', async () => {
  const dialogs = [];
  const { page: keyed, seen: keyedSeen } = await openPage(keyUrl, async (p) => {
    p.on('dialog', async (d) => {
      dialogs.push(d.message());
      await d.accept(apiKey);
    });
  });
  assert(dialogs.length === 1 && dialogs[0].includes('API key'), `dialogs: ${JSON.stringify(dialogs)}`);
  assert(await keyed.evaluate(() => localStorage.getItem('mla.apiKey')) === apiKey, 'the key was not kept');
  await setMaxTokens(keyed, 8);
  await sendWithEnter(keyed, 'With a key');
  const reply = await lastReplyDone(keyed);
  assert(!reply.error, `reply failed: ${reply.error}`);
  assert(keyedSeen.chatHeaders[0].authorization === `Bearer ${apiKey}`, JSON.stringify(keyedSeen.chatHeaders[0]));
  await keyed.reload({ waitUntil: 'networkidle0' });
  await keyed.waitForFunction(() => /context \d+ tokens/.test(document.getElementById('model').textContent));
  assert(dialogs.length === 1, 'asked again after a reload');
});

await check('no console errors and no other origin over the whole session', async () => {
  assert(seen.foreign.length === 0, `requests to other origins: ${seen.foreign.join(', ')}`);
  assert(seen.errors.length === 0, `console errors: ${seen.errors.join(' | ')}`);
});

await browser.close();
fs.rmSync(profile, { recursive: true, force: true });
finish();
