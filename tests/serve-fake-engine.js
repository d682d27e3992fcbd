#!/usr/bin/env node
// serve-fake-engine.js - a scripted engine speaking the engine protocol
// (docs/engine-protocol.md) for strata-serve's supervision tests.
//
// Tokens are bytes (id = byte value).  A generation writes FAKE_OUTPUT (default
// below) in tokens of FAKE_TOKLEN bytes, FAKE_DELAY_MS apart, then ends with
// "eos".  Faults: FAKE_EXIT_AFTER=N exits with status 3 after N tokens;
// FAKE_HANG_AFTER=N goes silent after N tokens; FAKE_FAIL_LOAD=1 exits before
// ready; FAKE_HOLD_READY=FILE delays ready while FILE exists.
'use strict';
const fs = require('fs');

const env = process.env;
const output = env.FAKE_OUTPUT ?? 'Hello world. This is STOP a test of the emergency broadcast system.';
const toklen = parseInt(env.FAKE_TOKLEN || '3', 10);
const delay = parseInt(env.FAKE_DELAY_MS || '0', 10);
const exitAfter = env.FAKE_EXIT_AFTER ? parseInt(env.FAKE_EXIT_AFTER, 10) : -1;
const hangAfter = env.FAKE_HANG_AFTER ? parseInt(env.FAKE_HANG_AFTER, 10) : -1;


function send(o) { process.stdout.write(JSON.stringify(o) + '\n'); }

const model = process.argv[process.argv.indexOf('-m') + 1];
process.stderr.write(`fake engine: loading ${model}\n`);
if (env.FAKE_FAIL_LOAD) {
  process.stderr.write(`fake engine: cannot open '${model}': bad magic\n`);
  process.exit(3);
}
send({ type: 'log', level: 'info', msg: 'loading 100%' });
// FAKE_HOLD_READY=FILE: stay "loading" while FILE exists
function ready() {
  if (env.FAKE_HOLD_READY && fs.existsSync(env.FAKE_HOLD_READY)) return setTimeout(ready, 50);
  send({
  type: 'ready', version: 1, model: 'fake', n_ctx: 4096, n_vocab: 256,
  chat_template: "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
  bos_token: '', eos_token: '<|im_end|>',
  });
}
ready();

let cur = null;
let hung = false;

function step() {
  const g = cur;
  if (!g || hung) return;
  if (g.cancel) return finish(g, 'cancelled');
  if (g.max >= 0 && g.n >= g.max) return finish(g, 'length');
  if (g.off >= g.bytes.length) return finish(g, 'eos');
  const piece = g.bytes.subarray(g.off, g.off + toklen);
  g.off += piece.length;
  g.n++;
  const text = piece.toString('utf8');
  const ev = { type: 'token', id: g.id, tok: piece[0], piece: text, text, logprob: -0.25 * g.n };
  if (g.top > 0) ev.top = [{ tok: piece[0], piece: text, logprob: -0.25 * g.n }];
  send(ev);
  if (exitAfter >= 0 && g.n >= exitAfter) {
    process.stderr.write('fake engine: simulated crash\n');
    process.exit(3);
  }
  if (hangAfter >= 0 && g.n >= hangAfter) { hung = true; return; }
  setTimeout(step, delay);
}

function finish(g, reason) {
  send({ type: 'done', id: g.id, reason, n_prompt: g.n_prompt, n_gen: g.n, n_cached: 0,
         t_prefill_ms: 1, t_decode_ms: 1 + g.n });
  cur = null;
}

let buf = '';
process.stdin.on('data', (d) => {
  buf += d.toString('utf8');
  let i;
  while ((i = buf.indexOf('\n')) >= 0) {
    const line = buf.slice(0, i);
    buf = buf.slice(i + 1);
    if (!line.trim()) continue;
    let q;
    try { q = JSON.parse(line); } catch (e) { send({ type: 'error', code: 'invalid', msg: 'bad json' }); continue; }
    if (hung) continue;
    if (q.type === 'generate') {
      const prompt = q.tokens ? Buffer.from(q.tokens) : Buffer.from(q.prompt || '', 'utf8');
      if (prompt.length === 0) { send({ type: 'error', id: q.id, code: 'invalid', msg: 'empty prompt' }); continue; }
      if (prompt.length > 4096) { send({ type: 'error', id: q.id, code: 'limit', msg: `prompt of ${prompt.length} tokens does not fit the context of 4096` }); continue; }
      cur = { id: q.id, bytes: Buffer.from(output, 'utf8'), off: 0, n: 0, max: q.max_tokens ?? -1,
              n_prompt: prompt.length, top: q.top_logprobs || 0, cancel: false };
      setTimeout(step, delay);
    } else if (q.type === 'cancel') {
      if (cur && cur.id === q.id) cur.cancel = true;
    } else if (q.type === 'tokenize') {
      send({ type: 'done', id: q.id, tokens: Array.from(Buffer.from(q.text, 'utf8')) });
    } else if (q.type === 'detokenize') {
      send({ type: 'done', id: q.id, text: Buffer.from(q.tokens).toString('utf8') });
    } else if (q.type === 'health') {
      send({ type: 'done', id: q.id, status: 'ok' });
    } else if (q.type === 'shutdown') {
      process.exit(0);
    }
  }
});
process.stdin.on('end', () => process.exit(0));
