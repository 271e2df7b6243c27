// One call of the Anthropic TypeScript SDK against poold, for the e2e test
// TestAnthropicSDK: node client.mjs STEP BASE_URL API_KEY MODEL prints, as
// one JSON line, what the SDK made of poold's answer. The test judges it.
//
//   create         messages.create: the text, usage and stop reason
//   stream         messages.stream: the text from its "text" events, and
//                  the final message's usage
//   create-error   messages.create that must fail: the error the SDK raised
//   stream-error   messages.stream that must fail: the text read, then the
//                  error the SDK raised
import Anthropic from '@anthropic-ai/sdk';

const [step, baseURL, apiKey, model] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
const params = { model, max_tokens: 5, messages: [{ role: 'user', content: 'one two three' }] };

const text = (message) => message.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

// raised describes an error the SDK raised: its class, status and type, the
// message poold wrote, poold's code, and the Retry-After header.
const raised = (err) => ({
  class: err?.constructor?.name ?? null,
  status: err?.status ?? null,
  type: err?.type ?? null,
  message: err?.apiMessage ?? String(err),
  code: err?.error?.error?.code ?? null,
  retryAfter: err?.headers?.get?.('retry-after') ?? null,
});

async function run() {
  switch (step) {
    case 'create': {
      const m = await client.messages.create(params);
      return { text: text(m), usage: m.usage, stopReason: m.stop_reason };
    }
    case 'stream': {
      let streamed = '';
      const s = client.messages.stream(params).on('text', (t) => { streamed += t; });
      const m = await s.finalMessage();
      return { text: streamed, final: text(m), usage: m.usage, stopReason: m.stop_reason };
    }
    case 'create-error':
      try {
        const m = await client.messages.create(params);
        return { error: null, text: text(m) };
      } catch (err) {
        return { error: raised(err) };
      }
    case 'stream-error': {
      let streamed = '';
      try {
        const s = client.messages.stream(params).on('text', (t) => { streamed += t; });
        await s.finalMessage();
        return { error: null, text: streamed };
      } catch (err) {
        return { error: raised(err), text: streamed };
      }
    }
    default:
      throw new Error(`unknown step ${step}`);
  }
}

console.log(JSON.stringify(await run()));
