// The checks of the end-to-end suites (agent.mjs, protocols.mjs, webui.mjs): one line per check,
// "ok N - name" or "not ok N - name" with the error's stack, then "P passed, F failed" and the
// exit status (non-zero when a check failed).
let failures = 0, count = 0;

export async function check(name, fn) {
  ++count;
  try {
    await fn();
    console.log(`ok ${count} - ${name}`);
  } catch (e) {
    ++failures;
    console.log(`not ok ${count} - ${name}\n  ${String((e && e.stack) || e).split('\n').join('\n  ')}`);
  }
}

export function assert(cond, msg) {
  if (!cond) throw new Error(msg);
}

export function equal(a, b, msg) {
  const sa = JSON.stringify(a), sb = JSON.stringify(b);
  if (sa !== sb) throw new Error(`${msg}: ${sa} !== ${sb}`);
}

export function finish() {
  console.log(`${count - failures} passed, ${failures} failed`);
  process.exit(failures ? 1 : 0);
}
