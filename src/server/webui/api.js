// The page's calls to `mla serve` (same origin): GET /v1/models and a streamed
// POST /v1/chat/completions, read as server-sent events. Failures become ApiError with the
// HTTP status (0: the server could not be reached) and the server's own error.message.

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
  }
}

function headers(key) {
  const h = { 'Content-Type': 'application/json' };
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

// fetch, with a network failure as ApiError(0); an abort stays an AbortError.
async function request(path, init) {
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, `server unreachable (${e.message})`);
  }
  if (!res.ok) {
    let message = `HTTP ${res.status} ${res.statusText}`;
    try {
      const body = await res.json();
      if (body && body.error && body.error.message) message = body.error.message;
    } catch {
      // not JSON: the status line says it
    }
    throw new ApiError(res.status, message);
  }
  return res;
}

// The served model: { id, max_model_len }.
export async function getModel(key) {
  const res = await request('/v1/models', { headers: headers(key) });
  const list = await res.json();
  const m = (list.data && list.data[0]) || {};
  return { id: m.id || '', maxModelLen: m.max_model_len || 0 };
}

// Starts a streamed chat completion; the response, whose events readEvents() yields.
export function openChatStream(body, key, signal) {
  return request('/v1/chat/completions', { method: 'POST', headers: headers(key), body: JSON.stringify(body), signal });
}

// The JSON objects of the response's `data:` lines until `data: [DONE]`. An error event
// ({"error": {...}}) is thrown as ApiError.
export async function* readEvents(res) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, nl).replace(/\r$/, '');
        buffer = buffer.slice(nl + 1);
        if (!line.startsWith('data:')) continue;  // blank separators, comments, event: lines
        const data = line.slice(5).trim();
        if (data === '[DONE]') return;
        const event = JSON.parse(data);
        if (event.error) throw new ApiError(event.error.status || 500, event.error.message || 'the server failed');
        yield event;
      }
    }
  } finally {
    reader.releaseLock();
  }
  throw new ApiError(0, 'the stream ended before [DONE]: server unreachable');
}
