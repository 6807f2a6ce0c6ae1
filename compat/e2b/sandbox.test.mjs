// Sandbox lifecycle through the unmodified e2b SDK: create, getInfo,
// setTimeout, list, pause and connect, kill.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import {
  AuthenticationError,
  CommandExitError,
  Sandbox,
  SandboxError,
  NotFoundError,
} from 'e2b'
import {
  RUN,
  SANDBOX_TIMEOUT_MS,
  SUITE_METADATA,
  TEST_TIMEOUT,
  assertNear,
  errName,
  rejection,
  waitFor,
  withSandbox,
} from './lib.mjs'

test('create with metadata, envs and timeoutMs; getInfo', { timeout: TEST_TIMEOUT }, async (t) => {
  const metadata = { ...SUITE_METADATA, case: 'create', note: 'spaces & symbols=ok' }
  const before = Date.now()
  const sbx = await Sandbox.create({
    metadata,
    envs: { SBX_ENV: 'from-create' },
    timeoutMs: 90_000,
  })
  try {
    assert.equal(typeof sbx.sandboxId, 'string')
    assert.ok(sbx.sandboxId.length > 0, 'sandboxId is empty')
    t.diagnostic(`sandboxId ${sbx.sandboxId}`)

    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.deepEqual(info.metadata, metadata)
    assert.equal(info.state, 'running')
    assert.ok(info.templateId, 'templateId is empty')
    assert.match(info.envdVersion, /^\d+\.\d+\.\d+/, 'envdVersion is not semver')
    assert.ok(info.cpuCount >= 1, `cpuCount ${info.cpuCount}`)
    assert.ok(info.memoryMB > 0, `memoryMB ${info.memoryMB}`)
    assert.ok(info.startedAt instanceof Date && !isNaN(info.startedAt), 'startedAt is not a date')
    assert.ok(info.endAt instanceof Date && !isNaN(info.endAt), 'endAt is not a date')
    // The clocks of the test and the daemon are the same machine's.
    assertNear(assert, info.startedAt.getTime(), before, 15_000, 'startedAt vs. the create call')
    assertNear(assert, info.endAt.getTime() - info.startedAt.getTime(), 90_000, 10_000,
      'endAt - startedAt with timeoutMs 90000')

    // The static form answers the same.
    const info2 = await Sandbox.getInfo(sbx.sandboxId)
    assert.equal(info2.sandboxId, sbx.sandboxId)
    assert.deepEqual(info2.metadata, metadata)

    assert.equal(await sbx.isRunning(), true)

    // The sandbox-level envs reach commands.
    const r = await sbx.commands.run('echo "$SBX_ENV"')
    assert.equal(r.stdout, 'from-create\n')
  } finally {
    await sbx.kill().catch(() => {})
  }
})

test('create without options uses the defaults (base template, 300 s)', { timeout: TEST_TIMEOUT }, async () => {
  // SDK 2.51 sends {"templateID":"base"} and no timeout: the server default
  // must be 300 s.
  const sbx = await Sandbox.create()
  try {
    const info = await sbx.getInfo()
    assert.equal(info.state, 'running')
    assertNear(assert, info.endAt.getTime() - info.startedAt.getTime(), 300_000, 15_000,
      'default timeout (endAt - startedAt)')
    assert.deepEqual(info.metadata, {})
  } finally {
    await sbx.kill().catch(() => {})
  }
})

test('a wrong API key is refused with AuthenticationError', { timeout: TEST_TIMEOUT }, async (t) => {
  const apiKey = 'e2b_0000000000000000000000000000000000000000'
  const err = await rejection(Sandbox.create({ apiKey, metadata: SUITE_METADATA }), 'create with a wrong key')
  t.diagnostic(`create with a wrong key: ${errName(err)}`)
  assert.ok(err instanceof AuthenticationError, `expected AuthenticationError, got ${errName(err)}`)

  const err2 = await rejection(Sandbox.list({ apiKey }).nextItems(), 'list with a wrong key')
  assert.ok(err2 instanceof AuthenticationError, `expected AuthenticationError, got ${errName(err2)}`)
})

test('setTimeout moves endAt', { timeout: TEST_TIMEOUT }, async () => {
  await withSandbox({ timeoutMs: 60_000 }, async (sbx) => {
    const info0 = await sbx.getInfo()
    assertNear(assert, info0.endAt.getTime() - Date.now(), 60_000, 10_000, 'initial endAt - now')

    await sbx.setTimeout(300_000)
    const info1 = await sbx.getInfo()
    assertNear(assert, info1.endAt.getTime() - Date.now(), 300_000, 10_000, 'endAt - now after setTimeout(300000)')
    assert.ok(info1.endAt > info0.endAt, 'endAt did not move later')

    // A timeout can also be shortened: expiry is now + timeout.
    await Sandbox.setTimeout(sbx.sandboxId, 30_000)
    const info2 = await sbx.getInfo()
    assertNear(assert, info2.endAt.getTime() - Date.now(), 30_000, 10_000, 'endAt - now after setTimeout(30000)')
    assert.equal(info2.state, 'running')
    assert.equal(await sbx.isRunning(), true)
  })
})

test('Sandbox.list filters by metadata and paginates', { timeout: TEST_TIMEOUT }, async (t) => {
  const listRun = `list-${RUN}`
  // The value has characters that the SDK's metadata encoding escapes.
  const match = { listRun, flavor: 'a b&c=d/é' }
  const created = []
  try {
    for (const metadata of [match, match, { listRun, flavor: 'other' }]) {
      const sbx = await Sandbox.create({
        timeoutMs: SANDBOX_TIMEOUT_MS,
        metadata: { ...SUITE_METADATA, ...metadata },
      })
      created.push(sbx)
    }
    const want = created.slice(0, 2).map((s) => s.sandboxId).sort()

    // One page (the default limit is 100).
    const p = Sandbox.list({ query: { metadata: match } })
    assert.equal(p.hasNext, true)
    const items = await p.nextItems()
    assert.deepEqual(items.map((s) => s.sandboxId).sort(), want,
      'Sandbox.list with the metadata filter must find exactly the two sandboxes created with it')
    for (const s of items) {
      assert.equal(s.state, 'running')
      assert.equal(s.metadata.listRun, listRun)
      assert.equal(s.metadata.flavor, match.flavor)
      assert.equal(s.metadata.run, RUN)
      assert.ok(s.startedAt instanceof Date && !isNaN(s.startedAt))
      assert.ok(s.endAt instanceof Date && !isNaN(s.endAt))
    }
    assert.equal(p.hasNext, false, 'a page holding everything must not announce a next page')

    // Pages of one: X-Next-Token drives the paginator.
    const paged = Sandbox.list({ query: { metadata: match }, limit: 1 })
    const pages = []
    while (paged.hasNext) {
      pages.push(await paged.nextItems())
      assert.ok(pages.length <= 3, 'paginator does not end')
    }
    t.diagnostic(`pages of limit 1: ${JSON.stringify(pages.map((p) => p.length))}`)
    assert.equal(pages[0].length, 1, 'the first page of limit 1 holds one sandbox')
    assert.deepEqual(pages.flat().map((s) => s.sandboxId).sort(), want)

    // Filtering on the shared key alone finds all three.
    const all = await Sandbox.list({ query: { metadata: { listRun } } }).nextItems()
    assert.equal(all.length, 3)

    // A killed sandbox is no longer listed.
    assert.equal(await created[0].kill(), true)
    const after = await Sandbox.list({ query: { metadata: match } }).nextItems()
    assert.deepEqual(after.map((s) => s.sandboxId), [created[1].sandboxId])
  } finally {
    await Promise.all(created.map((s) => s.kill().catch(() => {})))
  }
})

test('betaPause, then Sandbox.connect resumes with files and processes intact', { timeout: TEST_TIMEOUT }, async (t) => {
  const pauseRun = `pause-${RUN}`
  await withSandbox({ metadata: { pauseRun } }, async (sbx) => {
    const id = sbx.sandboxId
    await sbx.files.write('/home/user/state.txt', 'before pause\n')
    // A process that outlives the pause (the freezer keeps memory).
    const bg = await sbx.commands.run('sleep 600', { background: true, timeoutMs: 0 })
    await bg.disconnect()

    assert.equal(await sbx.betaPause(), true, 'betaPause() of a running sandbox returns true')
    const paused = await Sandbox.getInfo(id)
    assert.equal(paused.state, 'paused')
    assert.equal(await sbx.pause(), false, 'pause() of a paused sandbox returns false')
    assert.equal(await Sandbox.betaPause(id), false, 'Sandbox.betaPause() of a paused sandbox returns false')

    const listed = await Sandbox.list({ query: { metadata: { pauseRun }, state: ['paused'] } }).nextItems()
    assert.deepEqual(listed.map((s) => s.sandboxId), [id], 'list with state paused')
    const running = await Sandbox.list({ query: { metadata: { pauseRun }, state: ['running'] } }).nextItems()
    assert.deepEqual(running, [], 'list with state running while paused')

    const resumed = await Sandbox.connect(id, { timeoutMs: 60_000 })
    assert.equal(resumed.sandboxId, id)
    const info = await resumed.getInfo()
    assert.equal(info.state, 'running')

    assert.equal(await resumed.files.read('/home/user/state.txt'), 'before pause\n')
    const r = await resumed.commands.run('echo resumed; cat /home/user/state.txt')
    assert.equal(r.stdout, 'resumed\nbefore pause\n')
    const procs = await resumed.commands.list()
    t.diagnostic(`processes after resume: ${JSON.stringify(procs.map((p) => [p.pid, p.args]))}`)
    assert.ok(procs.some((p) => p.pid === bg.pid), 'the background process survived pause and resume')

    // connect to a running sandbox works too, and the old handle still works.
    const again = await Sandbox.connect(id)
    assert.equal((await again.commands.run('echo again')).stdout, 'again\n')
    assert.equal((await sbx.commands.run('echo old-handle')).stdout, 'old-handle\n')
  })
})

test('kill, then the sandbox is gone for every call', { timeout: TEST_TIMEOUT }, async (t) => {
  const sbx = await Sandbox.create({ timeoutMs: SANDBOX_TIMEOUT_MS, metadata: SUITE_METADATA })
  const id = sbx.sandboxId
  try {
    await sbx.files.write('/home/user/x.txt', 'x')
    assert.equal(await sbx.kill(), true, 'kill() of a running sandbox returns true')
    assert.equal(await Sandbox.kill(id), false, 'Sandbox.kill() of a killed sandbox returns false')
    assert.equal(await Sandbox.kill('nosuchsandbox0000000'), false, 'Sandbox.kill() of an unknown id returns false')

    const runErr = await rejection(sbx.commands.run('echo hi', { requestTimeoutMs: 10_000 }), 'commands.run on a killed sandbox')
    t.diagnostic(`commands.run on a killed sandbox: ${errName(runErr)}`)
    assert.ok(runErr instanceof SandboxError, `expected a SandboxError subclass, got ${errName(runErr)}`)

    const readErr = await rejection(sbx.files.read('/home/user/x.txt', { requestTimeoutMs: 10_000 }), 'files.read on a killed sandbox')
    t.diagnostic(`files.read on a killed sandbox: ${errName(readErr)}`)
    assert.ok(readErr instanceof SandboxError, `expected a SandboxError subclass, got ${errName(readErr)}`)

    assert.equal(await sbx.isRunning(), false, 'isRunning() after kill')

    const infoErr = await rejection(Sandbox.getInfo(id), 'getInfo of a killed sandbox')
    t.diagnostic(`getInfo of a killed sandbox: ${errName(infoErr)}`)
    assert.ok(infoErr instanceof NotFoundError, `expected SandboxNotFoundError, got ${errName(infoErr)}`)

    const connErr = await rejection(Sandbox.connect(id), 'connect to a killed sandbox')
    t.diagnostic(`connect to a killed sandbox: ${errName(connErr)}`)
    assert.ok(connErr instanceof NotFoundError, `expected SandboxNotFoundError, got ${errName(connErr)}`)

    const listed = await Sandbox.list({ query: { metadata: SUITE_METADATA } }).nextItems()
    assert.ok(!listed.some((s) => s.sandboxId === id), 'a killed sandbox is still listed')
  } finally {
    await Sandbox.kill(id).catch(() => {})
  }
})

test('a sandbox ends by itself at its timeout', { timeout: TEST_TIMEOUT }, async () => {
  const sbx = await Sandbox.create({ timeoutMs: 3_000, metadata: SUITE_METADATA })
  try {
    assert.equal(await sbx.isRunning(), true)
    await waitFor('the sandbox to end at its 3 s timeout', async () => !(await sbx.isRunning()), 20_000, 500)
    assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  } finally {
    await Sandbox.kill(sbx.sandboxId).catch(() => {})
  }
})

test('lifecycle onTimeout pause: paused at the timeout, auto-resumed by the next call', { timeout: TEST_TIMEOUT }, async () => {
  const sbx = await Sandbox.create({
    timeoutMs: 3_000,
    metadata: SUITE_METADATA,
    lifecycle: { onTimeout: 'pause', autoResume: true },
  })
  try {
    const info = await sbx.getInfo()
    assert.deepEqual(info.lifecycle, { onTimeout: 'pause', autoResume: true })
    await sbx.files.write('/home/user/kept.txt', 'kept')
    await waitFor('the sandbox to pause at its 3 s timeout',
      async () => (await Sandbox.getInfo(sbx.sandboxId)).state === 'paused', 20_000, 250)

    // Any envd call wakes it, with its files.
    assert.equal((await sbx.commands.run('cat /home/user/kept.txt')).stdout, 'kept')
    assert.equal((await sbx.getInfo()).state, 'running')
  } finally {
    await Sandbox.kill(sbx.sandboxId).catch(() => {})
  }
})

test('lifecycle onTimeout pause without autoResume: calls fail until connect', { timeout: TEST_TIMEOUT }, async (t) => {
  const sbx = await Sandbox.create({ timeoutMs: 3_000, metadata: SUITE_METADATA, lifecycle: { onTimeout: 'pause' } })
  try {
    await sbx.files.write('/home/user/kept.txt', 'kept')
    await waitFor('the sandbox to pause at its 3 s timeout',
      async () => (await Sandbox.getInfo(sbx.sandboxId)).state === 'paused', 20_000, 250)
    assert.equal(await sbx.isRunning(), false)
    const err = await rejection(sbx.commands.run('true', { requestTimeoutMs: 10_000 }), 'commands.run on a paused sandbox')
    t.diagnostic(`commands.run while paused: ${errName(err)}`)
    assert.ok(err instanceof SandboxError, `expected a SandboxError subclass, got ${errName(err)}`)
    assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused', 'a call must not resume it')

    const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
    assert.equal(await again.files.read('/home/user/kept.txt'), 'kept')
  } finally {
    await Sandbox.kill(sbx.sandboxId).catch(() => {})
  }
})

// Network egress through E2B's network.allowOut. Which name resolves to what
// depends on the daemon; the Go harness that runs this suite sets
// FORKBOX_E2B_ALLOWED_NAME and FORKBOX_E2B_ALLOWED_ADDR to a name its daemon
// resolves (without any lookup leaving the machine).
const allowedName = process.env.FORKBOX_E2B_ALLOWED_NAME
const allowedAddr = process.env.FORKBOX_E2B_ALLOWED_ADDR
test('network.allowOut gives an allow-list; other names do not resolve',
  { timeout: TEST_TIMEOUT, skip: allowedName ? false : 'FORKBOX_E2B_ALLOWED_NAME is not set' }, async () => {
    const lookup = (name) => `python3 -c "import socket; print(socket.getaddrinfo('${name}', 443, socket.AF_INET)[0][4][0])"`
    await withSandbox({ network: { allowOut: [allowedName] } }, async (sbx) => {
      assert.equal((await sbx.commands.run(lookup(allowedName))).stdout, `${allowedAddr}\n`)
      const e = await rejection(sbx.commands.run(lookup('not-allowed.invalid')), 'lookup of a name not allowed')
      assert.ok(e instanceof CommandExitError, `expected CommandExitError, got ${errName(e)}`)
      assert.match(e.stderr, /gaierror/)
      const env = (await sbx.commands.run('echo "$HTTPS_PROXY"')).stdout
      assert.match(env, /^http:\/\/10\.231\.\d+\.\d+:3128\n$/)
    })
    // Without network, nothing resolves and there is no interface but lo.
    await withSandbox({}, async (sbx) => {
      const e = await rejection(sbx.commands.run(lookup(allowedName)), 'lookup without a network')
      assert.ok(e instanceof CommandExitError, `expected CommandExitError, got ${errName(e)}`)
      assert.equal((await sbx.commands.run("ls /sys/class/net 2>/dev/null || ip -o link | cut -d: -f2")).stdout.trim(), 'lo')
    })
  })
