// The unmodified e2b CLI (@e2b/cli, pinned in package-lock.json) against
// forkbox: `sandbox list`, `sandbox logs`, `template list`. The CLI reads
// the same environment as the SDK: E2B_API_KEY and E2B_API_URL (its
// bundled SDK's ConnectionConfig).
import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { createRequire } from 'node:module'
import { dirname, join } from 'node:path'
import { test } from 'node:test'
import { TEST_TIMEOUT, withSandbox } from './lib.mjs'

const require = createRequire(import.meta.url)
const cli = join(dirname(require.resolve('@e2b/cli/package.json')), 'dist', 'index.js')

// e2b runs the CLI with args and resolves to its stdout; a non-zero exit
// rejects with its output. The update check (a registry lookup) is off.
function e2b(...args) {
  return new Promise((resolve, reject) => {
    execFile(process.execPath, [cli, ...args], {
      env: { ...process.env, NO_UPDATE_NOTIFIER: '1', NO_COLOR: '1', FORCE_COLOR: '0' },
      timeout: 30_000,
    }, (err, stdout, stderr) => {
      if (err) reject(new Error(`e2b ${args.join(' ')}: ${err.message}\n${stdout}\n${stderr}`))
      else resolve(stdout)
    })
  })
}

test('e2b template list shows the catalog', { timeout: TEST_TIMEOUT }, async () => {
  const out = JSON.parse(await e2b('template', 'list', '--format', 'json'))
  assert.ok(out.some((t) => t.templateID === 'base' && t.public), JSON.stringify(out).slice(0, 300))
})

test('e2b sandbox list and sandbox logs', { timeout: TEST_TIMEOUT }, async () => {
  await withSandbox({}, async (sbx) => {
    await sbx.commands.run('echo hello')
    // (Each CLI start loads a 2 MiB bundle: two at once.)
    const [list, logs] = await Promise.all([
      e2b('sandbox', 'list', '--format', 'json'),
      e2b('sandbox', 'logs', sbx.sandboxId, '--format', 'json'),
    ])
    const listed = JSON.parse(list)
    assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId), `${sbx.sandboxId} not in ${list.slice(0, 300)}`)
    const lines = logs.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l))
    const started = lines.find((l) => l.message === 'process started')
    assert.ok(started, `no process start in:\n${logs}`)
    assert.equal(started.level.toUpperCase(), 'INFO')
    assert.ok(!isNaN(new Date(started.timestamp)))
    assert.ok(lines.some((l) => l.message === 'process ended' && l.exit_code === '0'), `no process end in:\n${logs}`)
  })
})
