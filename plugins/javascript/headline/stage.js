// `headline-js`: a Ratchet stage written in JavaScript, built with
// componentize-js. Reads `draft`, asks the model (contract 0.2.0, a chat
// with a system prompt) for a headline, and proposes exactly its answer.
import { log } from 'ratchet:stage/log@0.2.0';
import { generate } from 'ratchet:stage/model@0.2.0';

const MANIFEST = `name = "headline-js"
version = "1.0.0"
description = "JavaScript stage: asks the model for a headline for the draft."
inputs = ["draft"]
outputs = ["headline"]
capabilities = ["model", "log"]
[limits]
timeout_ms = 60000
memory_mb = 256
`;

export function describe() {
  return MANIFEST;
}

// A `result` error is a thrown value: `{ tag, val }` of `stage-error`.
const fail = (tag, val) => ({ tag, val });

export function run(ctx, inputs) {
  const draft = inputs.find((a) => a.name === 'draft');
  if (!draft) throw fail('fatal', 'missing input `draft`');
  let text;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(draft.bytes);
  } catch (e) {
    throw fail('fatal', `input \`draft\` is not UTF-8: ${e}`);
  }
  log('info', `attempt ${ctx.attempt} writing a headline`);
  let answer;
  try {
    answer = generate({
      messages: [
        { role: 'system', content: 'You write one-line headlines.' },
        { role: 'user', content: `Write a headline for: ${text}` },
      ],
      stop: [],
      responseFormat: { tag: 'text' },
    });
  } catch (e) {
    // The host's `model-error`: unavailable is worth a retry, the rest is not.
    const error = e.payload ?? { tag: 'rejected', val: String(e) };
    throw fail(error.tag === 'unavailable' ? 'retryable' : 'fatal', String(error.val));
  }
  return [
    {
      name: 'headline',
      mediaType: 'text/plain; charset=utf-8',
      bytes: new TextEncoder().encode(answer.text),
    },
  ];
}
