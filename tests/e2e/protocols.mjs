// End-to-end tests of `mla serve`'s Anthropic Messages and OpenAI Responses endpoints through the
// official `@anthropic-ai/sdk` and `openai` npm clients. Run by
// tests/server/test_agent_clients_e2e.cpp, which starts two servers on a tiny random-weight
// checkpoint with DeepSeek-V3's tokenizer and chat template and passes their addresses:
//   MLA_URL        DeepSeek-V3's template (tool calls in its format), --api-key MLA_API_KEY
//   MLA_THINK_URL  the same template opening <think> when the template variable `thinking` is
//                  set, --reasoning-parser deepseek_r1, no key
// The model is random: what is checked is what the server guarantees whatever the model says
// (forced calls valid against their schemas, the thinking block and its signature, streamed ==
// whole, the stored conversation continued, errors in each API's shape), not what it answers.
// Prints one line per check and exits non-zero if any failed.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { assert, check, equal, finish } from './harness.mjs';

const url = process.env.MLA_URL, thinkUrl = process.env.MLA_THINK_URL, key = process.env.MLA_API_KEY;
if (!url || !thinkUrl || !key) {
  console.error('MLA_URL, MLA_THINK_URL and MLA_API_KEY must be set');
  process.exit(2);
}
const opts = { maxRetries: 0, timeout: 120000 };
const claude = new Anthropic({ baseURL: url, apiKey: key, ...opts });              // x-api-key
const claudeBearer = new Anthropic({ baseURL: url, authToken: key, apiKey: null, ...opts });  // Authorization: Bearer
const claudeThink = new Anthropic({ baseURL: thinkUrl, apiKey: 'unused', ...opts });
const openai = new OpenAI({ baseURL: url + '/v1', apiKey: key, ...opts });
const openaiThink = new OpenAI({ baseURL: thinkUrl + '/v1', apiKey: 'unused', ...opts });

async function rejects(promise, status, pattern, msg) {
  try {
    await promise;
  } catch (e) {
    assert(e.status === status, `${msg}: status ${e.status}, expected ${status} (${e.message})`);
    if (pattern) assert(pattern.test(e.message), `${msg}: message ${JSON.stringify(e.message)} does not match ${pattern}`);
    return e;
  }
  throw new Error(`${msg}: no error`);
}

// Enums: a random model with a 129k vocabulary almost never closes a free string, so the
// grammar's forced output would run to the token limit.
const weatherSchema = {
  type: 'object',
  properties: { city: { type: 'string', enum: ['Paris', 'Oslo'] }, unit: { type: 'string', enum: ['C', 'F'] } },
  required: ['city', 'unit'],
  additionalProperties: false,
};
function checkWeather(input, where) {
  assert(input && typeof input === 'object' && !Array.isArray(input), `${where}: input is not an object`);
  assert(['Paris', 'Oslo'].includes(input.city), `${where}: city ${JSON.stringify(input.city)}`);
  assert(['C', 'F'].includes(input.unit), `${where}: unit ${JSON.stringify(input.unit)}`);
  for (const k of Object.keys(input)) assert(k === 'city' || k === 'unit', `${where}: unexpected key ${k}`);
}
const outputText = (r) => r.output.filter((i) => i.type === 'message').flatMap((i) => i.content).filter((c) => c.type === 'output_text').map((c) => c.text).join('');
const anthropicTool = { name: 'get_weather', description: 'Weather of a city', input_schema: weatherSchema };
const responsesTool = { type: 'function', name: 'get_weather', description: 'Weather of a city', parameters: weatherSchema, strict: true };

// ---- Anthropic Messages ----

await check('messages: a plain reply in Anthropic shape', async () => {
  const m = await claude.messages.create({ model: 'any-name', max_tokens: 8, messages: [{ role: 'user', content: 'Hello' }] });
  assert(/^msg_/.test(m.id), `id ${m.id}`);
  equal([m.type, m.role], ['message', 'assistant'], 'type and role');
  assert(m.content.length >= 1 && m.content.every((b) => b.type === 'text'), 'text blocks');
  assert(['end_turn', 'max_tokens'].includes(m.stop_reason), `stop_reason ${m.stop_reason}`);
  const u = m.usage;
  assert(u.input_tokens > 0 && u.output_tokens > 0 && u.output_tokens <= 8, `usage ${JSON.stringify(u)}`);
  assert(typeof u.cache_read_input_tokens === 'number' && typeof u.cache_creation_input_tokens === 'number', 'cache usage fields');
});

await check('messages: Authorization Bearer authenticates as x-api-key does; a wrong key is 401', async () => {
  const m = await claudeBearer.messages.create({ model: 'm', max_tokens: 2, messages: [{ role: 'user', content: 'Hi' }] });
  assert(m.content.length >= 1, 'a reply');
  const bad = new Anthropic({ baseURL: url, apiKey: 'wrong', ...opts });
  const e = await rejects(bad.messages.create({ model: 'm', max_tokens: 2, messages: [{ role: 'user', content: 'Hi' }] }), 401, null, 'wrong key');
  equal(e.error?.error?.type, 'authentication_error', 'error type');
});

let forced;
await check('messages: a forced tool call is a tool_use block valid against input_schema', async () => {
  forced = await claude.messages.create({
    model: 'm', max_tokens: 64, tools: [anthropicTool], tool_choice: { type: 'tool', name: 'get_weather' },
    messages: [{ role: 'user', content: 'Weather in Paris?' }],
  });
  const calls = forced.content.filter((b) => b.type === 'tool_use');
  assert(calls.length === 1, `one tool_use block: ${JSON.stringify(forced.content)}`);
  assert(/^toolu_/.test(calls[0].id), `id ${calls[0].id}`);
  equal(calls[0].name, 'get_weather', 'name');
  checkWeather(calls[0].input, 'tool_use.input');
  equal(forced.stop_reason, 'tool_use', 'stop_reason');
});

await check('messages: streamed forced call — input_json_delta pieces join to the input', async () => {
  const stream = claude.messages.stream({
    model: 'm', max_tokens: 64, tools: [anthropicTool], tool_choice: { type: 'tool', name: 'get_weather' },
    messages: [{ role: 'user', content: 'Weather in Paris?' }],
  });
  const types = [];
  let json = '';
  stream.on('streamEvent', (e) => {
    types.push(e.type);
    if (e.type === 'content_block_delta' && e.delta.type === 'input_json_delta') json += e.delta.partial_json;
  });
  const m = await stream.finalMessage();
  equal(types[0], 'message_start', 'first event');
  equal(types.slice(-2), ['message_delta', 'message_stop'], 'last events');
  const call = m.content.find((b) => b.type === 'tool_use');
  assert(call, 'a tool_use block');
  checkWeather(call.input, 'streamed input');
  equal(JSON.parse(json), call.input, 'joined partial_json');
  equal(m.stop_reason, 'tool_use', 'stop_reason');
});

await check('messages: a tool result goes back into the prompt (count_tokens grows) and is answered', async () => {
  const call = forced.content.find((b) => b.type === 'tool_use');
  const history = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: forced.content },
  ];
  const result = { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, content: [{ type: 'text', text: 'Sunny, 21 degrees' }] }] };
  const errored = { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, content: 'city not found', is_error: true }] };
  const base = await claude.messages.countTokens({ model: 'm', tools: [anthropicTool], messages: [...history, { role: 'user', content: 'x' }] });
  const withResult = await claude.messages.countTokens({ model: 'm', tools: [anthropicTool], messages: [...history, result] });
  assert(withResult.input_tokens > base.input_tokens, `count_tokens ${withResult.input_tokens} <= ${base.input_tokens}`);
  const m = await claude.messages.create({ model: 'm', max_tokens: 4, tools: [anthropicTool], messages: [...history, result] });
  assert(m.content.length >= 1, 'a reply');
  const e = await claude.messages.create({ model: 'm', max_tokens: 4, tools: [anthropicTool], messages: [...history, errored] });
  assert(e.content.length >= 1, 'a reply to an error result');
});

await check('messages: count_tokens counts the system prompt (and tools where the template writes them)', async () => {
  const msgs = [{ role: 'user', content: 'Hello' }];
  const a = await claude.messages.countTokens({ model: 'm', messages: msgs });
  const b = await claude.messages.countTokens({ model: 'm', system: 'You are terse.', messages: msgs });
  const c = await claude.messages.countTokens({ model: 'm', system: 'You are terse.', tools: [anthropicTool], messages: msgs });
  assert(a.input_tokens > 0 && b.input_tokens > a.input_tokens && c.input_tokens >= b.input_tokens,
         `counts ${a.input_tokens}, ${b.input_tokens}, ${c.input_tokens}`);
});

await check('messages: thinking enabled gives a thinking block with a signature, streamed and whole', async () => {
  const req = { model: 'm', max_tokens: 12, temperature: 0, thinking: { type: 'enabled', budget_tokens: 1024 }, messages: [{ role: 'user', content: 'Think.' }] };
  const whole = await claudeThink.messages.create(req);
  const t = whole.content.find((b) => b.type === 'thinking');
  assert(t && t.thinking.length > 0 && typeof t.signature === 'string' && t.signature.length > 0, `thinking block: ${JSON.stringify(whole.content)}`);
  const stream = claudeThink.messages.stream(req);
  let signatures = 0, thinking = '';
  stream.on('streamEvent', (e) => {
    if (e.type === 'content_block_delta' && e.delta.type === 'signature_delta') ++signatures;
    if (e.type === 'content_block_delta' && e.delta.type === 'thinking_delta') thinking += e.delta.thinking;
  });
  const m = await stream.finalMessage();
  const st = m.content.find((b) => b.type === 'thinking');
  assert(st && signatures === 1 && st.signature.length > 0, `streamed thinking block, ${signatures} signature deltas`);
  equal(st.thinking, thinking, 'thinking deltas join to the block');
  equal(st.thinking, t.thinking, 'streamed == whole (greedy)');
});

await check('messages: earlier thinking blocks are accepted back in the history', async () => {
  const m = await claudeThink.messages.create({
    model: 'm', max_tokens: 4, thinking: { type: 'disabled' },
    messages: [
      { role: 'user', content: 'Hi' },
      { role: 'assistant', content: [{ type: 'thinking', thinking: 'greet back', signature: 'sig' }, { type: 'redacted_thinking', data: 'xyz' }, { type: 'text', text: 'Hello' }] },
      { role: 'user', content: 'Again' },
    ],
  });
  assert(m.content.length >= 1 && !m.content.some((b) => b.type === 'thinking'), 'no thinking when disabled');
});

await check('messages: images are a 400 saying the model takes text only', async () => {
  const e = await rejects(claude.messages.create({
    model: 'm', max_tokens: 4,
    messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }],
  }), 400, /text only/, 'image');
  equal(e.error?.type, 'error', 'Anthropic error shape');
  equal(e.error?.error?.type, 'invalid_request_error', 'error type');
});

await check('messages: a prompt past the context is "prompt is too long: N tokens > M maximum"', async () => {
  await rejects(claude.messages.create({ model: 'm', max_tokens: 4, messages: [{ role: 'user', content: 'word '.repeat(40000) }] }),
                400, /^.*prompt is too long: \d+ tokens > \d+ maximum/, 'too long');
});

await check('messages: stop_sequences end the reply with stop_reason stop_sequence or run to max_tokens', async () => {
  const m = await claude.messages.create({ model: 'm', max_tokens: 32, stop_sequences: ['e', 'a', 'o', 'i'], messages: [{ role: 'user', content: 'Say something' }] });
  assert(['stop_sequence', 'max_tokens', 'end_turn'].includes(m.stop_reason), `stop_reason ${m.stop_reason}`);
  if (m.stop_reason === 'stop_sequence') assert(['e', 'a', 'o', 'i'].includes(m.stop_sequence), `stop_sequence ${m.stop_sequence}`);
  else equal(m.stop_sequence, null, 'stop_sequence');
});

// ---- OpenAI Responses ----

await check('responses: a plain reply with usage', async () => {
  const r = await openai.responses.create({ model: 'any', input: 'Hello', max_output_tokens: 8 });
  assert(/^resp_/.test(r.id), `id ${r.id}`);
  assert(['completed', 'incomplete'].includes(r.status), `status ${r.status}`);
  if (r.status === 'incomplete') equal(r.incomplete_details?.reason, 'max_output_tokens', 'incomplete reason');
  assert(typeof r.output_text === 'string', 'output_text');
  assert(r.usage.input_tokens > 0 && r.usage.output_tokens > 0, `usage ${JSON.stringify(r.usage)}`);
  assert(typeof r.usage.input_tokens_details.cached_tokens === 'number', 'cached_tokens');
  assert(typeof r.usage.output_tokens_details.reasoning_tokens === 'number', 'reasoning_tokens');
});

let call;
await check('responses: a forced function call has JSON arguments valid against the schema', async () => {
  const r = await openai.responses.create({
    // A prompt of several cache pages, so that the continuation below finds them cached.
    model: 'm', input: 'Weather in Paris? ' + 'Answer with the tool, briefly. '.repeat(12), tools: [responsesTool],
    tool_choice: { type: 'function', name: 'get_weather' }, max_output_tokens: 64,
  });
  call = r.output.find((i) => i.type === 'function_call');
  assert(call, `a function_call item: ${JSON.stringify(r.output)}`);
  equal(call.name, 'get_weather', 'name');
  assert(call.call_id, 'call_id');
  checkWeather(JSON.parse(call.arguments), 'arguments');
  globalThis.firstResponse = r;
});

await check('responses: previous_response_id continues the stored conversation from its cached prefix', async () => {
  const first = globalThis.firstResponse;
  const r = await openai.responses.create({
    model: 'm', previous_response_id: first.id, tools: [responsesTool], max_output_tokens: 4,
    input: [{ type: 'function_call_output', call_id: call.call_id, output: 'Sunny, 21 degrees' }],
  });
  assert(['completed', 'incomplete'].includes(r.status), `status ${r.status}`);
  assert(r.usage.input_tokens > first.usage.input_tokens, `the stored conversation is in the prompt: ${r.usage.input_tokens} <= ${first.usage.input_tokens}`);
  assert(r.usage.input_tokens_details.cached_tokens > 0, `cached_tokens ${r.usage.input_tokens_details.cached_tokens}`);
  equal(r.previous_response_id, first.id, 'previous_response_id echoed');
});

await check('responses: GET and DELETE /v1/responses/{id}; an unknown id is a 404', async () => {
  const r = await openai.responses.create({ model: 'm', input: 'Hi', max_output_tokens: 2 });
  const got = await openai.responses.retrieve(r.id);
  equal(got.id, r.id, 'retrieved');
  await (openai.responses.delete ?? openai.responses.del).call(openai.responses, r.id);
  await rejects(openai.responses.retrieve(r.id), 404, null, 'deleted');
  await rejects(openai.responses.create({ model: 'm', input: 'Hi', previous_response_id: 'resp_unknown' }), 404, null, 'unknown previous id');
});

await check('responses: streamed forced call — events in order, argument deltas join', async () => {
  const stream = openai.responses.stream({
    model: 'm', input: 'Weather in Paris?', tools: [responsesTool], tool_choice: { type: 'function', name: 'get_weather' }, max_output_tokens: 64,
  });
  const types = [];
  let args = '', last = -1, ordered = true;
  for await (const e of stream) {
    types.push(e.type);
    if (e.sequence_number <= last) ordered = false;
    last = e.sequence_number;
    if (e.type === 'response.function_call_arguments.delta') args += e.delta;
  }
  const r = await stream.finalResponse();
  assert(ordered, 'sequence_number increases');
  equal(types.slice(0, 2), ['response.created', 'response.in_progress'], 'first events');
  assert(['response.completed', 'response.incomplete'].includes(types[types.length - 1]), `last event ${types[types.length - 1]}`);
  for (const t of ['response.output_item.added', 'response.function_call_arguments.done', 'response.output_item.done'])
    assert(types.includes(t), `missing ${t}`);
  const c = r.output.find((i) => i.type === 'function_call');
  assert(c, 'a function_call item');
  equal(args, c.arguments, 'argument deltas join');
  checkWeather(JSON.parse(c.arguments), 'streamed arguments');
});

await check('responses: streamed text — output_text deltas join to the text', async () => {
  const stream = openai.responses.stream({ model: 'm', input: 'Hello', max_output_tokens: 8 });
  let text = '';
  for await (const e of stream) if (e.type === 'response.output_text.delta') text += e.delta;
  const r = await stream.finalResponse();
  equal(text, outputText(r), 'deltas join');
});

await check('responses: text.format json_schema (strict) gives JSON valid against the schema', async () => {
  const r = await openai.responses.create({
    model: 'm', input: 'A city', max_output_tokens: 64,
    text: { format: { type: 'json_schema', name: 'city', schema: weatherSchema, strict: true } },
  });
  checkWeather(JSON.parse(outputText(r)), 'output_text');
});

await check('responses: reasoning effort turns thinking on; the reasoning item holds it', async () => {
  const r = await openaiThink.responses.create({ model: 'm', input: 'Think.', reasoning: { effort: 'high' }, max_output_tokens: 12 });
  const item = r.output.find((i) => i.type === 'reasoning');
  assert(item, `a reasoning item: ${JSON.stringify(r.output)}`);
  const text = (item.content || []).map((c) => c.text).join('');
  assert(text.length > 0, 'reasoning text');
  assert(r.usage.output_tokens_details.reasoning_tokens > 0, 'reasoning_tokens');
  const stream = openaiThink.responses.stream({ model: 'm', input: 'Think.', reasoning: { effort: 'high' }, max_output_tokens: 12 });
  let deltas = '', s;
  for await (const e of stream) {
    if (e.type === 'response.reasoning_text.delta') deltas += e.delta;
    // The server's own final object (this SDK version's snapshot does not gather reasoning text).
    if (e.type === 'response.completed' || e.type === 'response.incomplete') s = e.response;
  }
  const sitem = s.output.find((i) => i.type === 'reasoning');
  assert(sitem && deltas === sitem.content.map((c) => c.text).join(''), 'streamed reasoning deltas join to the item');
});

await check('responses: tools Codex sends (custom, namespace, web_search) are taken without a 400', async () => {
  const r = await openai.responses.create({
    model: 'm', input: [{ role: 'developer', content: 'Be brief.' }, { role: 'user', content: [{ type: 'input_text', text: 'Hi' }] }],
    max_output_tokens: 4,
    tools: [
      { type: 'custom', name: 'apply_patch', description: 'Apply a patch' },
      { type: 'namespace', name: 'files', description: 'File tools', tools: [{ type: 'function', name: 'read', description: 'Read a file', parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] } }] },
      { type: 'web_search' },
    ],
  });
  assert(['completed', 'incomplete'].includes(r.status), `status ${r.status}`);
});

await check('responses: errors in OpenAI shape (bad type, wrong key)', async () => {
  await rejects(openai.responses.create({ model: 'm', input: 5 }), 400, null, 'input of a wrong type');
  const bad = new OpenAI({ baseURL: url + '/v1', apiKey: 'wrong', ...opts });
  await rejects(bad.responses.create({ model: 'm', input: 'Hi' }), 401, null, 'wrong key');
});

finish();
