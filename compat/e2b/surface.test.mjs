// The rest of E2B's surface through the unmodified e2b SDK: templates,
// metrics history, network updates, sandbox logs, signed file URLs,
// autoResume after pause(), E2B error bodies on unknown paths and the
// answer to allowInternetAccess.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { CommandExitError, NotFoundError, Sandbox, SandboxError, Template } from 'e2b'
import { SUITE_METADATA, TEST_TIMEOUT, errName, rejection, waitFor, withSandbox } from './lib.mjs'

const apiURL = process.env.E2B_API_URL
const apiKey = process.env.E2B_API_KEY

// api calls forkbox's E2B control plane as the SDK does (X-API-KEY), for
// what the SDK has no method of its own for (the logs the CLI reads).
async function api(path) {
  const res = await fetch(new URL(path, apiURL), { headers: { 'X-API-KEY': apiKey } })
  return { status: res.status, body: await res.json() }
}

test('Template.exists finds the catalog and nothing else', { timeout: TEST_TIMEOUT }, async () => {
  assert.equal(await Template.exists('base'), true)
  assert.equal(await Template.exists('code-interpreter-v1'), true, 'the built-in alias')
  assert.equal(await Template.exists('no-such-template-anywhere'), false)
  const { status, body } = await api('/templates')
  assert.equal(status, 200)
  const base = body.find((t) => t.templateID === 'base')
  assert.ok(base, `base is not in ${JSON.stringify(body.map((t) => t.templateID))}`)
  assert.equal(base.public, true)
  assert.equal(base.buildStatus, 'ready')
  assert.deepEqual(base.aliases, ['base'])
  assert.ok(base.cpuCount >= 1 && base.memoryMB > 0 && base.envdVersion, JSON.stringify(base))
})

test('an unknown E2B path answers a readable E2B error', { timeout: TEST_TIMEOUT }, async () => {
  // forkbox has no template tags: the SDK shows the daemon's message.
  const e = await rejection(Template.getTags('base'), 'Template.getTags')
  assert.ok(!String(e.message).includes('[object Object]'), `unreadable: ${errName(e)}`)
  assert.match(e.message, /no such endpoint: GET \/templates\/base\/tags/, errName(e))
})

test('allowInternetAccess: true is refused, false gives no network', { timeout: TEST_TIMEOUT }, async () => {
  const e = await rejection(Sandbox.create({ allowInternetAccess: true, metadata: SUITE_METADATA }), 'open internet')
  assert.ok(e instanceof SandboxError && /^400: /.test(e.message), `expected a 400, got ${errName(e)}`)
  assert.match(e.message, /forkbox has no open internet; use network\.allowOut/)
  await withSandbox({ allowInternetAccess: false }, async (sbx) => {
    assert.equal((await sbx.commands.run('ls /sys/class/net')).stdout.trim(), 'lo')
  })
})

test('getMetrics returns the samples taken over time, in range', { timeout: TEST_TIMEOUT }, async () => {
  await withSandbox({}, async (sbx) => {
    const start = new Date()
    await sbx.commands.run('timeout 3 sh -c "while :; do :; done"; true')
    // The host samples every 5 s: two rounds and the sample taken now.
    const all = await waitFor('3 metrics samples', async () => {
      const m = await sbx.getMetrics({ start })
      return m.length >= 3 ? m : null
    }, 20_000, 1000)
    for (let i = 1; i < all.length; i++) {
      assert.ok(all[i].timestamp > all[i - 1].timestamp, 'samples are oldest first')
    }
    assert.ok(all.every((m) => m.memUsed > 0 && m.cpuCount >= 1 && m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100))
    assert.ok(all.some((m) => m.cpuUsedPct > 0), `no CPU seen: ${all.map((m) => m.cpuUsedPct)}`)
    const end = all.at(-2).timestamp
    const earlier = await sbx.getMetrics({ start, end })
    assert.ok(earlier.length >= 1 && earlier.every((m) => m.timestamp <= new Date(end.getTime() + 1000)),
      'end bounds the samples')
    assert.deepEqual(await sbx.getMetrics({ start: new Date(Date.now() + 60_000) }), [], 'a future start')
  })
})

test('the sandbox log has its commands', { timeout: TEST_TIMEOUT }, async () => {
  await withSandbox({}, async (sbx) => {
    await sbx.commands.run('true')
    const { status, body } = await api(`/sandboxes/${sbx.sandboxId}/logs`)
    assert.equal(status, 200)
    const started = body.logEntries.find((e) => e.message === 'process started' && e.fields.cmd === 'bash')
    assert.ok(started, `no process start in ${JSON.stringify(body.logEntries).slice(0, 500)}`)
    assert.ok(!isNaN(new Date(started.timestamp)) && started.level === 'info')
    const line = JSON.parse(body.logs.find((l) => l.line.includes('process ended')).line)
    assert.equal(line.exit_code, '0')
    const v2 = await api(`/v2/sandboxes/${sbx.sandboxId}/logs?direction=backward&limit=1&search=ended`)
    assert.equal(v2.status, 200)
    assert.equal(v2.body.logs.length, 1)
    assert.equal(v2.body.logs[0].message, 'process ended')
    assert.equal((await api('/sandboxes/nosuchsandbox0000000/logs')).status, 404)
  })
})

test('uploadUrl and downloadUrl work once without a key', { timeout: TEST_TIMEOUT }, async () => {
  await withSandbox({}, async (sbx) => {
    const path = '/home/user/signed.txt'
    const up = await sbx.uploadUrl(path, { useSignatureExpiration: 120 })
    assert.ok(!up.includes(apiKey), 'the URL carries no API key')
    const post = () => {
      const form = new FormData()
      form.append('file', new Blob(['through a signed URL\n']), path)
      return fetch(up, { method: 'POST', body: form })
    }
    const first = await post()
    assert.equal(first.status, 200, await first.text())
    const again = await post()
    assert.equal(again.status, 401, 'a used upload URL')
    assert.match((await again.json()).message, /used already/)
    assert.equal(await sbx.files.read(path), 'through a signed URL\n')

    const down = await sbx.downloadUrl(path)
    const got = await fetch(down)
    assert.equal(got.status, 200)
    assert.equal(await got.text(), 'through a signed URL\n')
    assert.equal((await fetch(down)).status, 401, 'a used download URL')

    // Tampered with (another path under the same signature) or expired: refused.
    const other = new URL(await sbx.downloadUrl(path))
    other.searchParams.set('path', '/etc/passwd')
    assert.equal((await fetch(other)).status, 401, 'a signature for another path')
    const short = await sbx.downloadUrl(path, { useSignatureExpiration: 1 })
    await new Promise((r) => setTimeout(r, 2100))
    const expired = await fetch(short)
    assert.equal(expired.status, 401)
    assert.match((await expired.json()).message, /expired/)
  })
})

test('autoResume: the next call after pause() resumes the sandbox', { timeout: TEST_TIMEOUT }, async () => {
  await withSandbox({ lifecycle: { onTimeout: 'pause', autoResume: true } }, async (sbx) => {
    await sbx.files.write('/home/user/kept.txt', 'kept\n')
    assert.equal(await sbx.pause(), true)
    assert.equal((await sbx.getInfo()).state, 'paused')
    assert.equal((await sbx.commands.run('cat /home/user/kept.txt')).stdout, 'kept\n')
    assert.equal((await sbx.getInfo()).state, 'running')
  })
  // Without autoResume a paused sandbox waits for connect().
  await withSandbox({}, async (sbx) => {
    await sbx.pause()
    await rejection(sbx.commands.run('true'), 'a command in a paused sandbox')
    assert.equal((await sbx.getInfo()).state, 'paused')
  })
})

const allowedName = process.env.FORKBOX_E2B_ALLOWED_NAME
const otherName = process.env.FORKBOX_E2B_OTHER_NAME
test('updateNetwork replaces the allow-list of a running sandbox; pause and fork keep it',
  { timeout: TEST_TIMEOUT, skip: allowedName && otherName ? false : 'FORKBOX_E2B_ALLOWED_NAME and _OTHER_NAME are not set' },
  async () => {
    const resolves = async (sbx, name) => {
      const py = `python3 -c "import socket; socket.getaddrinfo('${name}', 443, socket.AF_INET)"`
      try {
        await sbx.commands.run(py)
        return true
      } catch (e) {
        if (e instanceof CommandExitError) return false
        throw e
      }
    }
    await withSandbox({ network: { allowOut: [allowedName] } }, async (sbx) => {
      assert.deepEqual([await resolves(sbx, allowedName), await resolves(sbx, otherName)], [true, false])
      await sbx.updateNetwork({ allowOut: [otherName] })
      assert.deepEqual([await resolves(sbx, allowedName), await resolves(sbx, otherName)], [false, true], 'after the update')
      assert.equal(await sbx.pause(), true)
      await sbx.connect()
      assert.deepEqual([await resolves(sbx, allowedName), await resolves(sbx, otherName)], [false, true], 'after pause')
      const [fork] = await Sandbox.fork(sbx.sandboxId, { count: 1 })
      try {
        assert.deepEqual([await resolves(fork, allowedName), await resolves(fork, otherName)], [false, true], 'a fork')
      } finally {
        await fork.kill()
      }
      await sbx.updateNetwork({})
      assert.equal(await resolves(sbx, otherName), false, 'an empty update allows nothing')
      const bad = await rejection(sbx.updateNetwork({ allowOut: ['not a name'] }), 'a bad entry')
      assert.match(bad.message, /^400: .*network\.allowOut/)
    })
    await withSandbox({}, async (sbx) => {
      const e = await rejection(sbx.updateNetwork({ allowOut: [allowedName] }), 'a sandbox without a network')
      assert.ok(e instanceof SandboxError && /^409: /.test(e.message), `expected 409, got ${errName(e)}`)
    })
    const gone = await rejection(Sandbox.updateNetwork('nosuchsandbox0000000', { allowOut: [allowedName] }), 'unknown')
    assert.ok(gone instanceof NotFoundError, `expected NotFoundError, got ${errName(gone)}`)
  })
