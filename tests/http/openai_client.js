// Drives a running baton server's OpenAI-compatible HTTP API with the official openai Node
// client and checks that what comes back follows OpenAI's API: completions and chat
// completions, each non-streaming and streaming (SSE with a final usage chunk), a 400 for a
// bad request, and the model list.
//
//   BATON_NPM_DIR=build/npm node tests/http/openai_client.js \
//       --base-url http://127.0.0.1:PORT/v1 --model NAME [--api-key KEY] [--timeout-ms MS]
//
// BATON_NPM_DIR is where scripts/install_npm_deps.sh installed the pinned client
// (node_modules/openai). The requests decode greedily (temperature 0), so a streamed
// answer must equal the non-streamed one token for token.
//
// Prints one JSON line to stdout, {"ok", "checks": {name: bool}, "texts": {...}}, and each
// failed check with its reason to stderr. A request that throws records
// "<scenario>.request": false in place of that scenario's other checks. Exits 0 only when
// every check passes, 1 when one fails, 2 on a usage or set-up error.
'use strict';

const path = require('node:path');
const { parseArgs } = require('node:util');

const MAX_TOKENS = 12;
const FINISH_REASONS = ['length', 'stop'];
const COMPLETION_REQUEST = {
  prompt: 'The jury said',
  max_tokens: MAX_TOKENS,
  temperature: 0,
  seed: 1,
};
const CHAT_REQUEST = {
  messages: [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'Hello there' },
  ],
  max_tokens: MAX_TOKENS,
  temperature: 0,
};
const STREAM_OPTIONS = { stream: true, stream_options: { include_usage: true } };

function usage(message) {
  process.stderr.write(
    `openai_client: ${message}\n` +
      'usage: BATON_NPM_DIR=<build>/npm node tests/http/openai_client.js ' +
      '--base-url http://127.0.0.1:PORT/v1 --model NAME [--api-key KEY] [--timeout-ms MS]\n',
  );
  process.exit(2);
}

function parseOptions() {
  let values;
  try {
    ({ values } = parseArgs({
      options: {
        'base-url': { type: 'string' },
        model: { type: 'string' },
        'api-key': { type: 'string' },
        'timeout-ms': { type: 'string', default: '60000' },
      },
    }));
  } catch (err) {
    usage(err.message);
  }
  if (!values['base-url'] || !values.model) usage('--base-url and --model are required');
  const timeoutMs = Number(values['timeout-ms']);
  if (!Number.isInteger(timeoutMs) || timeoutMs <= 0) {
    usage('--timeout-ms must be a positive integer');
  }
  return {
    baseURL: values['base-url'],
    model: values.model,
    // The client refuses to run without a key; a server without auth ignores this one.
    apiKey: values['api-key'] ?? 'baton-no-key',
    timeoutMs,
  };
}

// The client lives in the build tree, not beside this file. It is loaded by its exact path so
// that no other copy up the folder tree can stand in for the pinned one.
function loadOpenAI() {
  const npmDir = process.env.BATON_NPM_DIR;
  if (!npmDir) usage('set BATON_NPM_DIR to the folder scripts/install_npm_deps.sh filled');
  try {
    return require(path.join(path.resolve(npmDir), 'node_modules', 'openai'));
  } catch (err) {
    usage(`cannot load openai from ${npmDir}/node_modules: ${err.message}`);
  }
}

const options = parseOptions();
const checks = {};
const texts = {};

function check(name, passed, reason) {
  checks[name] = Boolean(passed);
  if (!passed) process.stderr.write(`FAIL ${name}: ${reason}\n`);
}

function show(value) {
  return JSON.stringify(value) ?? String(value);
}

// An error with its HTTP status, or with its chain of causes (a refused connection shows as
// "Connection error." <- "fetch failed" <- "connect ECONNREFUSED ...").
function describe(err) {
  if (err && err.status) return `HTTP ${err.message}`;
  const parts = [];
  for (let cause = err; cause && parts.length < 4; cause = cause.cause) {
    parts.push(cause instanceof Error ? `${cause.name}: ${cause.message}` : String(cause));
  }
  return parts.join(' <- ');
}

// Runs one scenario's requests under a deadline, so a server that stops mid-stream fails the
// scenario instead of hanging the run: the client's own timeout covers only the wait for
// response headers. An aborted stream ends its iteration without an error, hence the checks
// of `signal` after each request.
async function runScenario(name, body) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), options.timeoutMs);
  try {
    await body(controller.signal);
    if (controller.signal.aborted) {
      throw new Error(`no complete answer within ${options.timeoutMs} ms`);
    }
  } catch (err) {
    check(`${name}.request`, false, describe(err));
  } finally {
    clearTimeout(timer);
  }
}

// Checks shared by both endpoints on a non-streamed answer.
function checkResponse(name, response, object) {
  check(
    `${name}.id`,
    typeof response.id === 'string' && response.id.length > 0,
    `id ${show(response.id)}`,
  );
  check(
    `${name}.object`,
    response.object === object,
    `object ${show(response.object)}, want ${show(object)}`,
  );
  const choice = response.choices && response.choices[0];
  check(
    `${name}.finish_reason`,
    choice && FINISH_REASONS.includes(choice.finish_reason),
    `finish_reason ${show(choice && choice.finish_reason)}`,
  );
  const used = response.usage || {};
  check(
    `${name}.usage`,
    Number.isInteger(used.prompt_tokens) &&
      used.prompt_tokens > 0 &&
      Number.isInteger(used.completion_tokens) &&
      used.completion_tokens >= 1 &&
      used.completion_tokens <= MAX_TOKENS,
    `usage ${show(response.usage)}, want prompt_tokens > 0 and ` +
      `1 <= completion_tokens <= ${MAX_TOKENS}`,
  );
}

// Reads a stream to its end and returns the concatenated text, the finish reason and the
// usage chunk, checking every chunk's id and object on the way. Per OpenAI's spec only the
// last chunk carries usage, and its choices are empty.
async function readStream(name, stream, object, textOf, signal) {
  let text = '';
  let finishReason = null;
  let usageChunk = null;
  let chunks = 0;
  const ids = new Set();
  const objects = new Set();
  let chunkAfterUsage = false;
  for await (const chunk of stream) {
    chunks += 1;
    if (usageChunk) chunkAfterUsage = true;
    ids.add(chunk.id);
    objects.add(chunk.object);
    for (const choice of chunk.choices || []) {
      text += textOf(choice) ?? '';
      if (choice.finish_reason) finishReason = choice.finish_reason;
    }
    if (chunk.usage) usageChunk = chunk;
  }
  if (signal.aborted) throw new Error(`stream unfinished after ${options.timeoutMs} ms`);
  const [id] = ids;
  check(
    `${name}.id`,
    chunks > 0 && ids.size === 1 && typeof id === 'string' && id.length > 0,
    `${chunks} chunks with ids ${show([...ids])}, want one non-empty id shared by all`,
  );
  check(
    `${name}.object`,
    chunks > 0 && objects.size === 1 && objects.has(object),
    `chunk objects ${show([...objects])}, want only ${show(object)}`,
  );
  check(
    `${name}.usage_chunk`,
    usageChunk && !chunkAfterUsage && (usageChunk.choices || []).length === 0,
    usageChunk
      ? `usage chunk ${show(usageChunk)} must be the last chunk and have empty choices`
      : 'no chunk carried usage although stream_options.include_usage was true',
  );
  return { text, finishReason, usage: usageChunk ? usageChunk.usage : null };
}

// Compares a streamed answer with the non-streamed one (null when that request failed).
function checkStreamAgainst(name, streamed, plain) {
  check(
    `${name}.finish_reason`,
    FINISH_REASONS.includes(streamed.finishReason) &&
      (!plain || streamed.finishReason === plain.finishReason),
    `finish_reason ${show(streamed.finishReason)}, ` +
      `non-streamed ${show(plain && plain.finishReason)}`,
  );
  const used = streamed.usage || {};
  check(
    `${name}.usage`,
    plain &&
      used.prompt_tokens > 0 &&
      used.prompt_tokens === plain.usage.prompt_tokens &&
      used.completion_tokens === plain.usage.completion_tokens,
    `usage ${show(streamed.usage)}, non-streamed ${show(plain && plain.usage)}`,
  );
  check(
    `${name}.text_matches`,
    plain && streamed.text === plain.text,
    `streamed ${show(streamed.text)}, non-streamed ${show(plain && plain.text)}`,
  );
}

async function completions(client) {
  let plain = null;
  await runScenario('completion', async (signal) => {
    const response = await client.completions.create(
      { model: options.model, ...COMPLETION_REQUEST },
      { signal },
    );
    checkResponse('completion', response, 'text_completion');
    const choice = (response.choices && response.choices[0]) || {};
    texts.completion = choice.text;
    check('completion.text', typeof choice.text === 'string', `text ${show(choice.text)}`);
    plain = { text: choice.text, finishReason: choice.finish_reason, usage: response.usage || {} };
  });
  await runScenario('completion_stream', async (signal) => {
    const stream = await client.completions.create(
      { model: options.model, ...COMPLETION_REQUEST, ...STREAM_OPTIONS },
      { signal },
    );
    const streamed = await readStream(
      'completion_stream',
      stream,
      'text_completion',
      (choice) => choice.text,
      signal,
    );
    texts.completion_stream = streamed.text;
    checkStreamAgainst('completion_stream', streamed, plain);
  });
}

async function chatCompletions(client) {
  let plain = null;
  await runScenario('chat', async (signal) => {
    const response = await client.chat.completions.create(
      { model: options.model, ...CHAT_REQUEST },
      { signal },
    );
    checkResponse('chat', response, 'chat.completion');
    const choice = (response.choices && response.choices[0]) || {};
    const message = choice.message || {};
    texts.chat = message.content;
    check(
      'chat.message',
      message.role === 'assistant' && typeof message.content === 'string',
      `message ${show(message)}, want role "assistant" and string content`,
    );
    plain = {
      text: message.content,
      finishReason: choice.finish_reason,
      usage: response.usage || {},
    };
  });
  await runScenario('chat_stream', async (signal) => {
    const stream = await client.chat.completions.create(
      { model: options.model, ...CHAT_REQUEST, ...STREAM_OPTIONS },
      { signal },
    );
    const streamed = await readStream(
      'chat_stream',
      stream,
      'chat.completion.chunk',
      (choice) => choice.delta && choice.delta.content,
      signal,
    );
    texts.chat_stream = streamed.text;
    checkStreamAgainst('chat_stream', streamed, plain);
  });
}

// A negative max_tokens must be refused with OpenAI's 400 error body, which the client turns
// into BadRequestError; its message is "400 <error.message>".
async function badRequest(client, OpenAI) {
  await runScenario('bad_request', async (signal) => {
    let thrown = null;
    try {
      await client.completions.create(
        { model: options.model, prompt: 'The jury said', max_tokens: -5 },
        { signal },
      );
    } catch (err) {
      thrown = err;
    }
    check(
      'bad_request.error',
      thrown instanceof OpenAI.BadRequestError &&
        thrown.status === 400 &&
        /max_tokens/.test(thrown.message),
      thrown
        ? `${thrown.constructor.name} (${describe(thrown)}), ` +
            'want BadRequestError, status 400, a message naming max_tokens'
        : 'max_tokens -5 was accepted',
    );
  });
}

async function modelsList(client) {
  await runScenario('models', async (signal) => {
    const page = await client.models.list({ signal });
    const ids = (page.data || []).map((model) => model.id);
    check(
      'models.list',
      ids.includes(options.model),
      `model ids ${show(ids)}, want ${show(options.model)} among them`,
    );
  });
}

async function main() {
  const OpenAI = loadOpenAI();
  // No retries, so a failure shows at once; organization and project are nulled so the
  // client sends no OPENAI_ORG_ID / OPENAI_PROJECT_ID headers from the environment.
  const client = new OpenAI({
    baseURL: options.baseURL,
    apiKey: options.apiKey,
    organization: null,
    project: null,
    maxRetries: 0,
    timeout: options.timeoutMs,
  });
  await completions(client);
  await chatCompletions(client);
  await badRequest(client, OpenAI);
  await modelsList(client);
  const ok = Object.keys(checks).length > 0 && Object.values(checks).every(Boolean);
  process.stdout.write(`${JSON.stringify({ ok, checks, texts })}\n`);
  process.exitCode = ok ? 0 : 1;
}

main().catch((err) => {
  process.stderr.write(`openai_client: ${err && err.stack ? err.stack : err}\n`);
  process.stdout.write(`${JSON.stringify({ ok: false, checks, texts })}\n`);
  process.exitCode = 1;
});
