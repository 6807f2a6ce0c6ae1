// Snapshots, forks and metrics through the unmodified e2b SDK.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { NotFoundError, Sandbox, SandboxError } from 'e2b'
import { RUN, SANDBOX_TIMEOUT_MS, SUITE_METADATA, TEST_TIMEOUT, errName, rejection, withSandbox } from './lib.mjs'

test('createSnapshot, create from it by id and by name, list, delete', { timeout: TEST_TIMEOUT }, async (t) => {
  await withSandbox({}, async (sbx) => {
    await sbx.files.write('/home/user/prepared.txt', 'prepared once\n')
    const name = `snap-${RUN}`
    const snap = await sbx.createSnapshot({ name })
    t.diagnostic(`snapshot ${JSON.stringify(snap)}`)
    assert.ok(snap.snapshotId, 'snapshotId is empty')
    assert.ok(snap.names.some((n) => n.includes(name)), `names ${JSON.stringify(snap.names)} miss ${name}`)

    // The source keeps running and keeps its own later changes.
    assert.equal((await sbx.getInfo()).state, 'running')
    await sbx.files.write('/home/user/prepared.txt', 'changed after the snapshot\n')

    const children = []
    try {
      for (const ref of [snap.snapshotId, name]) {
        const child = await Sandbox.create(ref, { timeoutMs: SANDBOX_TIMEOUT_MS, metadata: SUITE_METADATA })
        children.push(child)
        assert.notEqual(child.sandboxId, sbx.sandboxId)
        assert.equal(await child.files.read('/home/user/prepared.txt'), 'prepared once\n', `created from ${ref}`)
      }

      const listed = []
      const pages = Sandbox.listSnapshots({ sandboxId: sbx.sandboxId })
      while (pages.hasNext) listed.push(...(await pages.nextItems()))
      assert.deepEqual(listed.map((s) => s.snapshotId), [snap.snapshotId])
      const byName = await Sandbox.listSnapshots({ name }).nextItems()
      assert.deepEqual(byName.map((s) => s.snapshotId), [snap.snapshotId])
    } finally {
      await Promise.all(children.map((c) => c.kill().catch(() => {})))
    }

    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false, 'deleting a deleted snapshot')
    const e = await rejection(Sandbox.create(snap.snapshotId, { metadata: SUITE_METADATA }), 'create from a deleted snapshot')
    t.diagnostic(`create from a deleted snapshot: ${errName(e)}`)
    assert.ok(e instanceof SandboxError && /^404: /.test(e.message), `expected a 404 SandboxError, got ${errName(e)}`)
  })
})

test('fork gives independent copies of the files', { timeout: TEST_TIMEOUT }, async () => {
  await withSandbox({}, async (sbx) => {
    await sbx.files.write('/home/user/attempt.txt', 'base\n')
    const forks = await sbx.fork({ count: 3, timeoutMs: SANDBOX_TIMEOUT_MS })
    try {
      assert.equal(forks.length, 3)
      for (const f of forks) assert.ok(!(f instanceof Error), `a fork failed: ${f && errName(f)}`)
      const ids = new Set(forks.map((f) => f.sandboxId))
      assert.equal(ids.size, 3, 'fork ids are distinct')
      assert.ok(!ids.has(sbx.sandboxId))
      await Promise.all(forks.map((f, i) => f.files.write('/home/user/attempt.txt', `attempt ${i}\n`)))
      for (const [i, f] of forks.entries()) {
        assert.equal(await f.files.read('/home/user/attempt.txt'), `attempt ${i}\n`)
      }
      assert.equal(await sbx.files.read('/home/user/attempt.txt'), 'base\n', 'the source is untouched')
      assert.equal((await sbx.getInfo()).state, 'running')
    } finally {
      await Promise.all(forks.map((f) => (f instanceof Error ? null : f.kill().catch(() => {}))))
    }
  })
})

test('getMetrics reports the current usage', { timeout: TEST_TIMEOUT }, async () => {
  await withSandbox({}, async (sbx) => {
    await sbx.commands.run('head -c 8M /dev/zero > /home/user/eight-mib')
    const metrics = await sbx.getMetrics()
    assert.ok(metrics.length >= 1, 'no metrics')
    const m = metrics.at(-1)
    assert.ok(m.timestamp instanceof Date && !isNaN(m.timestamp))
    assert.ok(m.cpuCount >= 1, `cpuCount ${m.cpuCount}`)
    assert.ok(m.cpuUsedPct >= 0, `cpuUsedPct ${m.cpuUsedPct}`)
    assert.ok(m.memTotal > 0 && m.memUsed > 0 && m.memUsed <= m.memTotal, `mem ${m.memUsed}/${m.memTotal}`)
    assert.ok(m.diskTotal > 0 && m.diskUsed <= m.diskTotal, `disk ${m.diskUsed}/${m.diskTotal}`)

    const e = await rejection(Sandbox.getMetrics('nosuchsandbox0000000'), 'metrics of an unknown sandbox')
    assert.ok(e instanceof NotFoundError, `expected SandboxNotFoundError, got ${errName(e)}`)
  })
})
