// End-to-end tests of `mla serve` for agent clients, through the official `openai` npm client.
// Run by tests/server/test_agent_e2e.cpp, which starts two servers on a tiny random-weight
// checkpoint with a byte-level tokenizer and passes their addresses:
//   MLA_URL        DeepSeek-V3's chat template (tool calls in its format), --api-key MLA_API_KEY
//   MLA_THINK_URL  the same template with the generation prompt opening <think> when the
//                  template variable `thinking` is set (--chat-template-kwargs '{"thinking": true}',
//                  --reasoning-parser deepseek_r1)
// The model is random: what is checked is what the server guarantees whatever the model says
// (forced calls and JSON valid against their schemas, logprobs consistent with greedy choice,
// reasoning split, streamed == not streamed, errors), not what it answers.
// Prints one line per check and exits non-zero if any failed.
import OpenAI from 'openai';
import { assert, check, equal, finish } from './harness.mjs';

const url = process.env.MLA_URL, thinkUrl = process.env.MLA_THINK_URL, key = process.env.MLA_API_KEY;
if (!url || !thinkUrl || !key) {
  console.error('MLA_URL, MLA_THINK_URL and MLA_API_KEY must be set');
  process.exit(2);
}
const client = new OpenAI({ baseURL: url + '/v1', apiKey: key, maxRetries: 0, timeout: 120000 });
const think = new OpenAI({ baseURL: thinkUrl + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 120000 });


// A validator for the JSON Schema subset these tests use.
function validate(schema, v, path = '$') {
  if (schema.enum) assert(schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(v)), `${path}: ${JSON.stringify(v)} not in enum`);
  switch (schema.type) {
    case 'object': {
      assert(v !== null && typeof v === 'object' && !Array.isArray(v), `${path}: not an object`);
      for (const r of schema.required || []) assert(r in v, `${path}: missing ${r}`);
      for (const [k, x] of Object.entries(v)) {
        if (schema.properties && k in schema.properties) validate(schema.properties[k], x, `${path}.${k}`);
        else assert(schema.additionalProperties !== false, `${path}: unexpected ${k}`);
      }
      break;
    }
    case 'array':
      assert(Array.isArray(v), `${path}: not an array`);
      if (schema.maxItems !== undefined) assert(v.length <= schema.maxItems, `${path}: too many items`);
      if (schema.minItems !== undefined) assert(v.length >= schema.minItems, `${path}: too few items`);
      v.forEach((x, i) => schema.items && validate(schema.items, x, `${path}[${i}]`));
      break;
    case 'string':
      assert(typeof v === 'string', `${path}: not a string`);
      if (schema.maxLength !== undefined) assert([...v].length <= schema.maxLength, `${path}: too long`);
      break;
    case 'integer':
      assert(Number.isInteger(v), `${path}: not an integer`);
      if (schema.minimum !== undefined) assert(v >= schema.minimum, `${path}: below minimum`);
      if (schema.maximum !== undefined) assert(v <= schema.maximum, `${path}: above maximum`);
      break;
    case 'boolean':
      assert(typeof v === 'boolean', `${path}: not a boolean`);
      break;
  }
}

const weather = {
  type: 'object',
  properties: {
    city: { type: 'string', enum: ['Paris', 'Tokyo', 'Lima'] },
    days: { type: 'integer', minimum: 1, maximum: 14 },
    hourly: { type: 'boolean' },
  },
  required: ['city', 'days'],
  additionalProperties: false,
};
const clock = { type: 'object', properties: { zone: { type: 'string', enum: ['UTC', 'CET'] } }, required: ['zone'] };
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather forecast', parameters: weather } },
  { type: 'function', function: { name: 'get_time', description: 'The time in a zone', parameters: clock } },
];
const schemaOf = { get_weather: weather, get_time: clock };
const messages = [{ role: 'user', content: 'Hi' }];

// A streamed chat completion gathered as a non-streamed message.
async function gather(c, body) {
  const stream = await c.chat.completions.create({ ...body, stream: true });
  const choices = [];
  for await (const chunk of stream) {
    for (const ch of chunk.choices) {
      const m = (choices[ch.index] ||= { content: '', reasoning_content: '', tool_calls: [], finish_reason: null, logprobs: [] });
      const d = ch.delta || {};
      if (d.content) m.content += d.content;
      if (d.reasoning_content) m.reasoning_content += d.reasoning_content;
      for (const tc of d.tool_calls || []) {
        const t = (m.tool_calls[tc.index] ||= { id: '', name: '', arguments: '' });
        if (tc.id) t.id = tc.id;
        if (tc.function?.name) t.name += tc.function.name;
        if (tc.function?.arguments) t.arguments += tc.function.arguments;
      }
      if (ch.logprobs?.content) m.logprobs.push(...ch.logprobs.content);
      if (ch.finish_reason) m.finish_reason = ch.finish_reason;
    }
  }
  return choices;
}

function callsOf(message) {
  return (message.tool_calls || []).map((t) => ({ name: t.function.name, arguments: t.function.arguments }));
}

// With parallel_tool_calls the model may go on calling until max_tokens (a random model does):
// then the calls that completed are checked, and the output was cut ("length").
for (const [label, choice, parallel] of [
  ['named', { type: 'function', function: { name: 'get_weather' } }, false],
  ['required', 'required', false],
  ['required, parallel', 'required', true],
]) {
  await check(`tool_choice ${label}: a call valid against its schema, streamed == not streamed`, async () => {
    const body = { model: 'agent', messages, tools, tool_choice: choice, temperature: 0, max_tokens: 230, parallel_tool_calls: parallel };
    const r = await client.chat.completions.create(body);
    const m = r.choices[0].message;
    if (!parallel) equal(r.choices[0].finish_reason, 'tool_calls', 'finish_reason');
    else assert(['tool_calls', 'length'].includes(r.choices[0].finish_reason), 'finish_reason ' + r.choices[0].finish_reason);
    assert(m.tool_calls && m.tool_calls.length >= 1, 'no tool call: ' + JSON.stringify(m));
    if (parallel === false || typeof choice === 'object') equal(m.tool_calls.length, 1, 'one call');
    for (const t of m.tool_calls) {
      equal(t.type, 'function', 'type');
      assert(/^call_[0-9A-Za-z]{24}$/.test(t.id), 'id ' + t.id);
      if (typeof choice === 'object') equal(t.function.name, 'get_weather', 'the named function');
      assert(t.function.name in schemaOf, 'unknown function ' + t.function.name);
      validate(schemaOf[t.function.name], JSON.parse(t.function.arguments));
    }
    const s = await gather(client, body);
    equal(s[0].finish_reason, r.choices[0].finish_reason, 'streamed finish_reason');
    equal(s[0].tool_calls.map((t) => ({ name: t.name, arguments: t.arguments })), callsOf(m), 'streamed calls');
    equal(s[0].content, m.content || '', 'streamed content');
  });
}

await check('tool history (assistant tool_calls, tool message) renders and the server answers', async () => {
  const r = await client.chat.completions.create({
    model: 'agent', temperature: 0, max_tokens: 2, tools, tool_choice: 'auto',
    messages: [
      ...messages,
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_time', arguments: '{"zone":"UTC"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"t":1}' },
    ],
  });
  assert(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason), 'finish ' + r.choices[0].finish_reason);
  assert(r.usage.prompt_tokens > 40, 'the history is in the prompt: ' + r.usage.prompt_tokens);
});

const person = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 8 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    tags: { type: 'array', items: { type: 'string', enum: ['a', 'b'] }, maxItems: 3 },
  },
  required: ['name', 'age', 'tags'],
  additionalProperties: false,
};

await check('response_format json_schema (strict): content valid against the schema, streamed == not streamed', async () => {
  const body = {
    model: 'agent', messages: [{ role: 'user', content: 'A person' }], temperature: 0, max_tokens: 200,
    response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: person } },
  };
  const r = await client.chat.completions.create(body);
  equal(r.choices[0].finish_reason, 'stop', 'finish_reason');
  validate(person, JSON.parse(r.choices[0].message.content));
  const s = await gather(client, body);
  equal(s[0].content, r.choices[0].message.content, 'streamed content');
});

await check('response_format json_schema with sampling: every seed gives valid JSON', async () => {
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.create({
      model: 'agent', messages: [{ role: 'user', content: 'A person' }], temperature: 1, seed, max_tokens: 200,
      response_format: { type: 'json_schema', json_schema: { name: 'person', schema: person, strict: true } },
    });
    validate(person, JSON.parse(r.choices[0].message.content));
  }
});

await check('response_format json_object: an object when the model finishes', async () => {
  const r = await client.chat.completions.create({
    model: 'agent', messages: [{ role: 'user', content: 'JSON please' }], temperature: 0, max_tokens: 120,
    response_format: { type: 'json_object' },
  });
  const c = r.choices[0].message.content;
  assert(c.startsWith('{'), 'starts with {: ' + c);
  if (r.choices[0].finish_reason === 'stop') {
    const v = JSON.parse(c);
    assert(v && typeof v === 'object' && !Array.isArray(v), 'an object');
  }
});

await check('chat logprobs: the top logprob is the sampled token at temperature 0, streamed == not streamed', async () => {
  const body = { model: 'agent', messages, temperature: 0, max_tokens: 12, logprobs: true, top_logprobs: 3 };
  const r = await client.chat.completions.create(body);
  const lp = r.choices[0].logprobs.content;
  const finish = r.choices[0].finish_reason;
  equal(lp.length, r.usage.completion_tokens - (finish === 'stop' ? 1 : 0), 'one entry per token');
  for (const e of lp) {
    assert(e.logprob <= 0, 'a log-probability: ' + e.logprob);
    equal(e.top_logprobs.length, 3, 'top_logprobs');
    equal(e.top_logprobs[0].bytes, e.bytes, 'the top entry is the sampled token');
    assert(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6, 'its logprob');
    assert(e.top_logprobs[1].logprob <= e.top_logprobs[0].logprob, 'sorted');
  }
  const bytes = Buffer.from(lp.flatMap((e) => e.bytes));
  if (!r.choices[0].message.content.includes('\ufffd')) equal(bytes.toString('utf8'), r.choices[0].message.content, 'the bytes are the content');
  const s = await gather(client, body);
  equal(s[0].logprobs, lp, 'streamed logprobs');
});

await check('completions logprobs: the legacy shape, consistent with the greedy choice', async () => {
  const r = await client.completions.create({ model: 'agent', prompt: 'The cat', temperature: 0, max_tokens: 10, logprobs: 2 });
  const lp = r.choices[0].logprobs;
  equal(lp.tokens.length, 10, 'tokens');
  equal(lp.token_logprobs.length, 10, 'token_logprobs');
  equal(lp.top_logprobs.length, 10, 'top_logprobs');
  equal(lp.text_offset[0], 0, 'text_offset starts at 0');
  for (let i = 0; i < 10; ++i) {
    const best = Math.max(...Object.values(lp.top_logprobs[i]));
    assert(Math.abs(best - lp.token_logprobs[i]) < 1e-6, `token ${i}: the top logprob is the sampled token's`);
    if (i > 0) assert(lp.text_offset[i] >= lp.text_offset[i - 1], 'offsets grow');
  }
});

await check('n = 2: two choices, seeded per choice, reproducible', async () => {
  const body = { model: 'agent', messages, temperature: 1, seed: 7, max_tokens: 10, n: 2 };
  const a = await client.chat.completions.create(body), b = await client.chat.completions.create(body);
  equal(a.choices.map((c) => c.index), [0, 1], 'indexes');
  equal(a.choices.map((c) => c.message.content), b.choices.map((c) => c.message.content), 'the same seed, the same choices');
  assert(a.choices[0].message.content !== a.choices[1].message.content, 'the choices differ');
  const s = await gather(client, body);
  equal(s.map((c) => c.content), a.choices.map((c) => c.message.content), 'streamed choices');
});

await check('logit_bias: a token pushed to +100 is sampled', async () => {
  const tok = await (await fetch(url + '/tokenize', { method: 'POST', body: JSON.stringify({ prompt: 'Z', add_special_tokens: false }) })).json();
  const r = await client.completions.create({ model: 'agent', prompt: 'The cat', temperature: 0, max_tokens: 3, logit_bias: { [tok.tokens[0]]: 100 } });
  equal(r.choices[0].text, 'ZZZ', 'the biased token');
});

// Reasoning: the think server opens <think> when `thinking` is set (its default).
const thinkPrompt = '<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>\n';
await check('reasoning_content: the output of an opened <think> block, streamed == not streamed', async () => {
  const body = { model: 'think', messages: [{ role: 'user', content: 'Hi' }], temperature: 0, max_tokens: 20 };
  const r = await think.chat.completions.create(body);
  const m = r.choices[0].message;
  const ids = await (await fetch(thinkUrl + '/tokenize', { method: 'POST', body: JSON.stringify({ prompt: thinkPrompt, add_special_tokens: false }) })).json();
  equal(r.usage.prompt_tokens, ids.tokens.length, 'the prompt opened <think>');
  const raw = (await think.completions.create({ model: 'think', prompt: ids.tokens, temperature: 0, max_tokens: 20 })).choices[0].text;
  const end = raw.indexOf('</think>');
  const want = end < 0 ? { reasoning: raw, content: '' } : { reasoning: raw.slice(0, end), content: raw.slice(end + 8).replace(/^\s+/, '') };
  assert(want.reasoning.length > 0, 'some reasoning');
  equal(m.reasoning_content, want.reasoning, 'reasoning_content');
  equal(m.content, want.content, 'content');
  const s = await gather(think, body);
  equal(s[0].reasoning_content, m.reasoning_content, 'streamed reasoning_content');
  equal(s[0].content, m.content, 'streamed content');
});

await check('chat_template_kwargs per request over the server default: thinking off, all content', async () => {
  const r = await think.chat.completions.create({
    model: 'think', messages: [{ role: 'user', content: 'Hi' }], temperature: 0, max_tokens: 20,
    chat_template_kwargs: { thinking: false },
  });
  const m = r.choices[0].message;
  assert(m.reasoning_content === null || m.reasoning_content === undefined, 'no reasoning: ' + m.reasoning_content);
  assert(m.content.length > 0, 'content');
  const ids = await (await fetch(thinkUrl + '/tokenize', { method: 'POST', body: JSON.stringify({ prompt: '<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜>', add_special_tokens: false }) })).json();
  equal(r.usage.prompt_tokens, ids.tokens.length, 'the prompt did not open <think>');
});

await check('reasoning in an earlier assistant turn goes to the template (which drops it)', async () => {
  const r = await think.chat.completions.create({
    model: 'think', temperature: 0, max_tokens: 4,
    messages: [{ role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello', reasoning_content: 'greet back' }, { role: 'user', content: 'Bye' }],
  });
  assert(r.choices[0].message.reasoning_content.length > 0, 'reasoning');
});

// Request hygiene: 400s naming the field.
for (const [name, body, param] of [
  ['an unknown field', { messages, frobnicate: 1 }, 'frobnicate'],
  ['tool_choice naming a missing tool', { messages, tools, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice'],
  ['tool_choice without tools', { messages, tool_choice: 'required' }, 'tool_choice'],
  ['top_logprobs > 20', { messages, logprobs: true, top_logprobs: 21 }, 'top_logprobs'],
  ['an unsupported schema keyword', { messages, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', patternProperties: { '^a': { type: 'string' } } } } } }, 'response_format'],
  ['a malformed schema', { messages, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', required: 'a' } } } }, 'response_format'],
  ['a tool with a bad name', { messages, tools: [{ type: 'function', function: { name: 'a b' } }] }, 'tools'],
]) {
  await check(`400 for ${name}`, async () => {
    try {
      await client.chat.completions.create({ model: 'agent', max_tokens: 4, ...body });
    } catch (e) {
      assert(e instanceof OpenAI.BadRequestError, 'a BadRequestError: ' + e);
      equal(e.status, 400, 'status');
      equal(e.param, param, 'param');
      if (name === 'an unsupported schema keyword') assert(e.message.includes('patternProperties'), 'names the keyword: ' + e.message);
      return;
    }
    throw new Error('no error');
  });
}

await check('--api-key: a wrong key is 401 on /v1, /health needs none', async () => {
  const wrong = new OpenAI({ baseURL: url + '/v1', apiKey: 'wrong', maxRetries: 0 });
  try {
    await wrong.models.list();
    throw new Error('no error');
  } catch (e) {
    assert(e instanceof OpenAI.AuthenticationError, 'an AuthenticationError: ' + e);
  }
  equal((await fetch(url + '/health')).status, 200, '/health');
  const models = await client.models.list();
  equal(models.data[0].id, 'agent', 'the right key');
});

await check('/tokenize and /detokenize round-trip', async () => {
  const t = await (await fetch(url + '/tokenize', { method: 'POST', body: JSON.stringify({ prompt: 'hello world', add_special_tokens: false }) })).json();
  assert(t.tokens.length > 0 && t.count === t.tokens.length, 'tokens');
  const d = await (await fetch(url + '/detokenize', { method: 'POST', body: JSON.stringify({ tokens: t.tokens }) })).json();
  equal(d.prompt, 'hello world', 'prompt');
  equal(d.content, 'hello world', 'content');
});

finish();
