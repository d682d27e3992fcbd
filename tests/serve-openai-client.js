#!/usr/bin/env node
// serve-openai-client.js - drives strata-serve with the official `openai` npm
// client and prints what it got as one JSON object, for t0404-serve-openai.sh.
//
//   node serve-openai-client.js OPENAI_MODULE_DIR BASE_URL API_KEY MODEL FORCE_FILE
//
// FORCE_FILE is the engine's STRATA_TEST_FORCE_OUTPUT_FILE test hook: the
// tools round trip writes the model's scripted output there.
'use strict';
const fs = require('fs');
const [modDir, baseURL, apiKey, model, forceFile] = process.argv.slice(2);
const { OpenAI } = require(modDir);

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];

async function main() {
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
  const out = {};
  const msgs = [{ role: 'user', content: 'write a function' }];

  const c = await client.chat.completions.create({ model, messages: msgs, max_tokens: 16, temperature: 0 });
  out.chat = { content: c.choices[0].message.content, finish: c.choices[0].finish_reason, usage: c.usage };

  const stream = await client.chat.completions.create({
    model, messages: msgs, max_tokens: 16, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '', usage = null, finish = null, chunks = 0;
  for await (const ch of stream) {
    chunks++;
    if (ch.usage) usage = ch.usage;
    for (const choice of ch.choices) {
      text += choice.delta?.content ?? '';
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  out.stream = { content: text, finish, usage, chunks };

  const p = await client.completions.create({ model, prompt: 'def quicksort(arr):', max_tokens: 24, temperature: 0 });
  out.completion = { text: p.choices[0].text, finish: p.choices[0].finish_reason, usage: p.usage };

  const models = await client.models.list();
  out.models = models.data.map((m) => m.id);

  // tools: the scripted model calls get_weather; the result goes back; the model answers
  fs.writeFileSync(forceFile, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>');
  const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const t1 = await client.chat.completions.create({ model, messages: ask, tools, tool_choice: 'auto' });
  const call = t1.choices[0].message.tool_calls?.[0];
  out.tool_call = {
    finish: t1.choices[0].finish_reason,
    name: call?.function?.name,
    arguments: call ? JSON.parse(call.function.arguments) : null,
    id: call?.id,
  };

  // content before a call: streamed as it comes, the call when complete
  fs.writeFileSync(forceFile, 'I will look it up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>');
  const tn = await client.chat.completions.create({ model, messages: ask, tools });
  const ts = await client.chat.completions.create({ model, messages: ask, tools, stream: true });
  const acc = {};
  let tfinish = null, tcontent = '';
  for await (const ch of ts) {
    for (const choice of ch.choices) {
      tcontent += choice.delta?.content ?? '';
      for (const d of choice.delta?.tool_calls ?? []) {
        acc[d.index] ??= { name: '', arguments: '' };
        if (d.function?.name) acc[d.index].name += d.function.name;
        if (d.function?.arguments) acc[d.index].arguments += d.function.arguments;
      }
      if (choice.finish_reason) tfinish = choice.finish_reason;
    }
  }
  out.tool_content = { stream: tcontent, whole: tn.choices[0].message.content,
                       calls: tn.choices[0].message.tool_calls?.length };
  out.tool_stream = { finish: tfinish, calls: Object.values(acc).map((x) => ({ name: x.name, arguments: JSON.parse(x.arguments) })) };

  fs.writeFileSync(forceFile, 'It is sunny in Paris.');
  const t2 = await client.chat.completions.create({
    model, tools,
    messages: [...ask, t1.choices[0].message,
      { role: 'tool', tool_call_id: call?.id ?? 'call_0', content: '{"sky": "sunny"}' }],
  });
  out.tool_answer = { content: t2.choices[0].message.content, finish: t2.choices[0].finish_reason };
  fs.writeFileSync(forceFile, '');

  try {
    await client.chat.completions.create({ model: 'no-such-model', messages: msgs });
    out.not_found = 'no error';
  } catch (e) {
    out.not_found = { status: e.status, code: e.code ?? e.error?.code };
  }
  try {
    await new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 }).models.list();
    out.bad_key = 'no error';
  } catch (e) {
    out.bad_key = { status: e.status };
  }
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => {
  process.stdout.write(JSON.stringify({ error: String(e && e.stack || e) }));
  process.exit(1);
});
