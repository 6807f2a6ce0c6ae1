// The sandbox filesystem through the unmodified e2b SDK.
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { test } from 'node:test'
import { FileNotFoundError, FileType, FilesystemEventType } from 'e2b'
import { TEST_TIMEOUT, errName, rejection, waitFor, withSandbox } from './lib.mjs'

const sha256 = (b) => createHash('sha256').update(b).digest('hex')

// toArrayBuffer copies a Uint8Array's bytes into an ArrayBuffer of their own,
// which files.write takes.
const toArrayBuffer = (u8) => u8.buffer.slice(u8.byteOffset, u8.byteOffset + u8.byteLength)

test('files.write and files.read: text, bytes, large, empty', { timeout: TEST_TIMEOUT }, async (t) => {
  await withSandbox({}, async (sbx) => {
    // Text.
    const text = 'hello e2b\nsecond line é €\n'
    const w = await sbx.files.write('/home/user/hello.txt', text)
    assert.equal(w.path, '/home/user/hello.txt')
    assert.equal(w.name, 'hello.txt')
    assert.equal(w.type, FileType.FILE)
    assert.equal(await sbx.files.read('/home/user/hello.txt'), text)
    assert.equal((await sbx.commands.run('cat /home/user/hello.txt')).stdout, text)
    const hi = await sbx.files.getInfo('/home/user/hello.txt')
    assert.equal(hi.owner, 'user', 'a file written as the default user belongs to it')

    // Overwrite.
    await sbx.files.write('/home/user/hello.txt', 'replaced')
    assert.equal(await sbx.files.read('/home/user/hello.txt'), 'replaced')

    // Bytes that are not UTF-8.
    const bytes = new Uint8Array(512)
    for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 7 + 0x80) & 0xff
    bytes.set([0xff, 0xfe, 0x00, 0xc3, 0x28, 0xa0, 0xa1, 0xe2, 0x28, 0xa1], 0)
    await sbx.files.write('/home/user/bin.dat', toArrayBuffer(bytes))
    const back = await sbx.files.read('/home/user/bin.dat', { format: 'bytes' })
    assert.ok(back instanceof Uint8Array, `read bytes gave ${back?.constructor?.name}`)
    assert.deepEqual(Buffer.from(back), Buffer.from(bytes))
    assert.equal((await sbx.commands.run('sha256sum /home/user/bin.dat')).stdout.split(' ')[0], sha256(bytes))
    const blob = await sbx.files.read('/home/user/bin.dat', { format: 'blob' })
    assert.deepEqual(Buffer.from(await blob.arrayBuffer()), Buffer.from(bytes))

    // Large (20 MiB), with its digest checked inside the sandbox too.
    const big = randomBytes(20 << 20)
    const t0 = Date.now()
    await sbx.files.write('/home/user/big.bin', toArrayBuffer(big))
    const t1 = Date.now()
    const bigBack = await sbx.files.read('/home/user/big.bin', { format: 'bytes' })
    t.diagnostic(`20 MiB: write ${t1 - t0} ms, read ${Date.now() - t1} ms`)
    assert.equal(bigBack.length, big.length)
    assert.equal(sha256(bigBack), sha256(big))
    assert.equal((await sbx.commands.run('sha256sum /home/user/big.bin')).stdout.split(' ')[0], sha256(big))
    assert.equal((await sbx.files.getInfo('/home/user/big.bin')).size, big.length)

    // Stream read of the large file.
    const stream = await sbx.files.read('/home/user/big.bin', { format: 'stream' })
    const h = createHash('sha256')
    let n = 0
    for await (const chunk of stream) {
      h.update(chunk)
      n += chunk.length
    }
    assert.equal(n, big.length)
    assert.equal(h.digest('hex'), sha256(big))

    // Empty.
    await sbx.files.write('/home/user/empty.txt', '')
    assert.equal(await sbx.files.read('/home/user/empty.txt'), '')
    assert.equal((await sbx.files.read('/home/user/empty.txt', { format: 'bytes' })).length, 0)
    assert.equal((await sbx.files.getInfo('/home/user/empty.txt')).size, 0)

    // Parents are created; relative paths resolve against the home.
    await sbx.files.write('/home/user/deep/er/file.txt', 'deep')
    assert.equal(await sbx.files.read('/home/user/deep/er/file.txt'), 'deep')
    await sbx.files.write('relative.txt', 'rel')
    assert.equal(await sbx.files.read('/home/user/relative.txt'), 'rel')

    // Several files in one call.
    const infos = await sbx.files.write([
      { path: '/home/user/multi/a.txt', data: 'A' },
      { path: '/home/user/multi/b.txt', data: 'B' },
    ])
    assert.deepEqual(infos.map((i) => i.path).sort(), ['/home/user/multi/a.txt', '/home/user/multi/b.txt'])
    assert.equal(await sbx.files.read('/home/user/multi/b.txt'), 'B')

    // As root, somewhere the default user may not write.
    await sbx.files.write('/root/secret.txt', 'root only', { user: 'root' })
    assert.equal(await sbx.files.read('/root/secret.txt', { user: 'root' }), 'root only')
    assert.equal((await sbx.files.getInfo('/root/secret.txt', { user: 'root' })).owner, 'root')

    // A missing file.
    const e = await rejection(sbx.files.read('/home/user/nope.txt'), 'read of a missing file')
    assert.ok(e instanceof FileNotFoundError, `expected FileNotFoundError, got ${errName(e)}`)
  })
})

test('files: list, makeDir, rename, remove, exists, getInfo', { timeout: TEST_TIMEOUT }, async () => {
  await withSandbox({}, async (sbx) => {
    const d = '/home/user/dir1'
    assert.equal(await sbx.files.exists(d), false)
    assert.equal(await sbx.files.makeDir(d), true, 'makeDir of a new directory returns true')
    assert.equal(await sbx.files.makeDir(d), false, 'makeDir of an existing directory returns false')
    assert.equal(await sbx.files.makeDir(`${d}/x/y/z`), true, 'makeDir creates parents')
    assert.equal(await sbx.files.exists(d), true)

    await sbx.files.write(`${d}/a.txt`, 'aaaa')
    await sbx.files.write(`${d}/sub/b.txt`, 'bb')

    const entries = await sbx.files.list(d)
    const byName = Object.fromEntries(entries.map((e) => [e.name, e]))
    assert.deepEqual(Object.keys(byName).sort(), ['a.txt', 'sub', 'x'])
    assert.equal(byName['a.txt'].type, FileType.FILE)
    assert.equal(byName['a.txt'].path, `${d}/a.txt`)
    assert.equal(byName['a.txt'].size, 4)
    assert.equal(byName.sub.type, FileType.DIR)
    assert.equal(byName.x.type, FileType.DIR)

    const deep = await sbx.files.list(d, { depth: 2 })
    const paths = deep.map((e) => e.path).sort()
    assert.ok(paths.includes(`${d}/sub/b.txt`), `depth 2 lists sub/b.txt: ${JSON.stringify(paths)}`)
    assert.ok(paths.includes(`${d}/x/y`), `depth 2 lists x/y: ${JSON.stringify(paths)}`)
    assert.ok(!paths.includes(`${d}/x/y/z`), `depth 2 stops at two levels: ${JSON.stringify(paths)}`)

    // getInfo of a file and a directory.
    const fi = await sbx.files.getInfo(`${d}/a.txt`)
    assert.equal(fi.name, 'a.txt')
    assert.equal(fi.path, `${d}/a.txt`)
    assert.equal(fi.type, FileType.FILE)
    assert.equal(fi.size, 4)
    assert.equal(fi.owner, 'user')
    assert.match(fi.permissions, /^-[rwx-]{9}$/)
    assert.ok(fi.modifiedTime instanceof Date && !isNaN(fi.modifiedTime), 'modifiedTime')
    assertRecent(fi.modifiedTime)
    const di = await sbx.files.getInfo(d)
    assert.equal(di.type, FileType.DIR)
    assert.equal(di.name, 'dir1')
    assert.match(di.permissions, /^d[rwx-]{9}$/)

    // rename
    const moved = await sbx.files.rename(`${d}/a.txt`, `${d}/c.txt`)
    assert.equal(moved.path, `${d}/c.txt`)
    assert.equal(moved.name, 'c.txt')
    assert.equal(await sbx.files.exists(`${d}/a.txt`), false)
    assert.equal(await sbx.files.exists(`${d}/c.txt`), true)
    assert.equal(await sbx.files.read(`${d}/c.txt`), 'aaaa')

    // remove a file, then a whole tree
    await sbx.files.remove(`${d}/c.txt`)
    assert.equal(await sbx.files.exists(`${d}/c.txt`), false)
    await sbx.files.remove(d)
    assert.equal(await sbx.files.exists(d), false)
    assert.equal(await sbx.files.exists(`${d}/sub/b.txt`), false)

    // Missing paths.
    const e = await rejection(sbx.files.getInfo('/home/user/missing'), 'getInfo of a missing path')
    assert.ok(e instanceof FileNotFoundError, `expected FileNotFoundError, got ${errName(e)}`)
    const e2 = await rejection(sbx.files.list('/home/user/missing'), 'list of a missing path')
    assert.ok(e2 instanceof FileNotFoundError, `expected FileNotFoundError, got ${errName(e2)}`)
  })
})

test('files.watchDir reports a file created after the watch started', { timeout: TEST_TIMEOUT }, async (t) => {
  await withSandbox({}, async (sbx) => {
    const d = '/home/user/watched'
    await sbx.files.makeDir(d)
    const events = []
    let exitErr = null
    const w = await sbx.files.watchDir(d, (ev) => { events.push(ev) }, {
      timeoutMs: 30_000,
      onExit: (err) => { exitErr = err ?? null },
    })
    try {
      await sbx.files.write(`${d}/new.txt`, 'new')
      await sbx.commands.run(`mkdir ${d}/newdir && rm ${d}/new.txt`)
      await waitFor('a create event of new.txt',
        () => events.some((e) => e.name === 'new.txt' && e.type === FilesystemEventType.CREATE))
      await waitFor('a write event of new.txt',
        () => events.some((e) => e.name === 'new.txt' && e.type === FilesystemEventType.WRITE))
      await waitFor('a remove event of new.txt',
        () => events.some((e) => e.name === 'new.txt' && e.type === FilesystemEventType.REMOVE))
      await waitFor('a create event of newdir',
        () => events.some((e) => e.name === 'newdir' && e.type === FilesystemEventType.CREATE))
      t.diagnostic(`events: ${JSON.stringify(events.map((e) => [e.type, e.name]))}`)
      assert.ok(!events.some((e) => e.name.startsWith('.forkbox-upload')),
        'the upload\'s temporary file shows in the events')
    } finally {
      await w.stop()
    }
    assert.equal(exitErr, null, `the watch ended with an error: ${exitErr && errName(exitErr)}`)

    // After stop, no more events are delivered.
    const n = events.length
    await sbx.files.write(`${d}/after-stop.txt`, 'x')
    await new Promise((r) => setTimeout(r, 500))
    assert.equal(events.length, n, 'events after stop()')

    // Watching a missing directory fails.
    const e = await rejection(sbx.files.watchDir('/home/user/not-there', () => {}), 'watchDir of a missing directory')
    assert.ok(e instanceof FileNotFoundError, `expected FileNotFoundError, got ${errName(e)}`)
  })
})

function assertRecent(date) {
  assert.ok(Math.abs(date.getTime() - Date.now()) < 5 * 60_000, `modifiedTime ${date.toISOString()} is not recent`)
}
