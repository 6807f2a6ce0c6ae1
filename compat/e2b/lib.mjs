// Shared helpers of the e2b SDK compatibility tests. The SDK itself reads its
// configuration from the environment, exactly as an E2B user's program does:
//
//   E2B_API_URL      the forkbox daemon (control plane), http://127.0.0.1:PORT
//   E2B_SANDBOX_URL  the same URL (envd requests carry E2b-Sandbox-Id)
//   E2B_API_KEY      the forkbox API key (sent as X-API-KEY)
import { randomBytes } from 'node:crypto'
import { Sandbox } from 'e2b'

const missing = ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY'].filter(
  (k) => !process.env[k]
)
if (missing.length > 0) {
  throw new Error(
    `set ${missing.join(', ')}: E2B_API_URL and E2B_SANDBOX_URL to the forkbox ` +
      'daemon (http://127.0.0.1:PORT), E2B_API_KEY to its API key'
  )
}

// RUN identifies this test run; metadata filters use it so that sandboxes of
// other runs (or other tests) never match.
export const RUN = `${Date.now().toString(36)}-${randomBytes(4).toString('hex')}`

// Every sandbox the tests create carries this metadata, and a timeout, so a
// crashed run leaves nothing behind for long.
export const SUITE_METADATA = { suite: 'forkbox-e2b-compat', run: RUN }
export const SANDBOX_TIMEOUT_MS = 120_000

// Per-test time limits for node:test (a hang guard).
export const TEST_TIMEOUT = 60_000

// withSandbox creates a sandbox, runs fn(sandbox) and kills the sandbox
// afterwards whatever happened.
export async function withSandbox(opts, fn) {
  const sbx = await Sandbox.create({
    timeoutMs: SANDBOX_TIMEOUT_MS,
    ...opts,
    metadata: { ...SUITE_METADATA, ...(opts?.metadata ?? {}) },
  })
  try {
    return await fn(sbx)
  } finally {
    await Sandbox.kill(sbx.sandboxId).catch(() => {})
  }
}

// waitFor polls cond() until it returns a truthy value (returned) or the
// deadline passes (throws, naming what was awaited).
export async function waitFor(what, cond, timeoutMs = 10_000, everyMs = 100) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const v = await cond()
    if (v) return v
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    }
    await new Promise((r) => setTimeout(r, everyMs))
  }
}

// rejection awaits p, which must reject, and returns the error.
export async function rejection(p, what) {
  try {
    await p
  } catch (err) {
    return err
  }
  throw new Error(`${what} resolved; expected it to fail`)
}

// errName names an error's class for diagnostics.
export function errName(err) {
  return `${err?.constructor?.name ?? typeof err} (${err?.name}): ${String(err?.message).slice(0, 200)}`
}

// closeTo asserts |actual - expected| <= tolerance.
export function assertNear(assert, actual, expected, tolerance, what) {
  assert.ok(
    Math.abs(actual - expected) <= tolerance,
    `${what}: ${actual} is not within ${tolerance} of ${expected}`
  )
}
