// Commands and PTYs through the unmodified e2b SDK.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { CommandExitError } from 'e2b'
import { TEST_TIMEOUT, errName, rejection, waitFor, withSandbox } from './lib.mjs'

test('commands.run: output, callbacks, exit codes', { timeout: TEST_TIMEOUT }, async () => {
  await withSandbox({}, async (sbx) => {
    const out = []
    const err = []
    const r = await sbx.commands.run('echo out-line; echo err-line >&2; printf "no newline"', {
      onStdout: (d) => out.push(d),
      onStderr: (d) => err.push(d),
    })
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'out-line\nno newline')
    assert.equal(r.stderr, 'err-line\n')
    assert.equal(out.join(''), r.stdout, 'onStdout received all of stdout')
    assert.equal(err.join(''), r.stderr, 'onStderr received all of stderr')

    // Output is streamed while the command runs, not delivered at its end.
    let firstAt = 0
    const t0 = Date.now()
    const r2 = await sbx.commands.run('echo first; sleep 2; echo second', {
      onStdout: () => { firstAt ||= Date.now() },
    })
    const doneAt = Date.now()
    assert.equal(r2.stdout, 'first\nsecond\n')
    assert.ok(firstAt > 0, 'onStdout was not called')
    assert.ok(doneAt - firstAt >= 1_000,
      `the first line arrived ${firstAt - t0} ms after start, only ${doneAt - firstAt} ms before the end: not streamed`)

    // A non-zero exit raises CommandExitError carrying the result.
    const e = await rejection(sbx.commands.run('echo partial; echo oops >&2; exit 3'), 'exit 3')
    assert.ok(e instanceof CommandExitError, `expected CommandExitError, got ${errName(e)}`)
    assert.equal(e.exitCode, 3)
    assert.equal(e.stdout, 'partial\n')
    assert.equal(e.stderr, 'oops\n')

    const e2 = await rejection(sbx.commands.run('false'), 'false')
    assert.ok(e2 instanceof CommandExitError, `expected CommandExitError, got ${errName(e2)}`)
    assert.equal(e2.exitCode, 1)

    // A missing program is exit code 127 from the shell.
    const e3 = await rejection(sbx.commands.run('no-such-program-xyz'), 'missing program')
    assert.ok(e3 instanceof CommandExitError, `expected CommandExitError, got ${errName(e3)}`)
    assert.equal(e3.exitCode, 127)

    // Bytes split across chunks and non-ASCII output decode correctly.
    const r3 = await sbx.commands.run("printf 'h\\303\\251llo \\342\\202\\254\\n'")
    assert.equal(r3.stdout, 'héllo €\n')

    // Larger output arrives complete and in order.
    const r4 = await sbx.commands.run('seq 1 20000')
    const lines = r4.stdout.trimEnd().split('\n')
    assert.equal(lines.length, 20000)
    assert.equal(lines[0], '1')
    assert.equal(lines[19999], '20000')
  })
})

test('commands.run: cwd, user and envs', { timeout: TEST_TIMEOUT }, async () => {
  await withSandbox({ envs: { SBX_ENV: 'sandbox-level', SHARED: 'from-sandbox' } }, async (sbx) => {
    assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
    assert.equal((await sbx.commands.run('pwd')).stdout, '/home/user\n', 'the default cwd is the home of "user"')

    // Default user is "user" (uid 1000); user: 'root' runs as uid 0.
    assert.equal((await sbx.commands.run('id -un; id -u')).stdout, 'user\n1000\n')
    assert.equal((await sbx.commands.run('id -un; id -u', { user: 'root' })).stdout, 'root\n0\n')
    assert.equal((await sbx.commands.run('pwd', { user: 'root' })).stdout, '/root\n', 'the default cwd of root is /root')
    assert.equal((await sbx.commands.run('echo "$HOME"')).stdout, '/home/user\n')

    // Sandbox-level envs (from create) and per-command envs both arrive;
    // the command's win.
    const r = await sbx.commands.run('echo "$SBX_ENV|$CMD_ENV|$SHARED"', {
      envs: { CMD_ENV: 'command-level', SHARED: 'from-command' },
    })
    assert.equal(r.stdout, 'sandbox-level|command-level|from-command\n')
    const r2 = await sbx.commands.run('echo "$SBX_ENV|$CMD_ENV|$SHARED"')
    assert.equal(r2.stdout, 'sandbox-level||from-sandbox\n', 'per-command envs do not stick')
    const r3 = await sbx.commands.run('echo "$SBX_ENV"', { user: 'root' })
    assert.equal(r3.stdout, 'sandbox-level\n', 'sandbox-level envs reach root commands too')

    // Files created by the default user belong to it.
    await sbx.commands.run('touch /tmp/owned-by-user')
    assert.equal((await sbx.commands.run('stat -c %U /tmp/owned-by-user')).stdout, 'user\n')
  })
})

test('background commands: list, kill', { timeout: TEST_TIMEOUT }, async (t) => {
  await withSandbox({}, async (sbx) => {
    const out = []
    const h = await sbx.commands.run('echo bg-started; sleep 300', {
      background: true,
      timeoutMs: 0,
      onStdout: (d) => out.push(d),
    })
    assert.ok(Number.isInteger(h.pid) && h.pid > 0, `pid ${h.pid}`)
    await waitFor('the background command to print', () => out.join('').includes('bg-started\n'))

    const h2 = await sbx.commands.run('sleep 301', { background: true, timeoutMs: 0 })
    assert.notEqual(h2.pid, h.pid)

    const listed = await sbx.commands.list()
    t.diagnostic(`commands.list: ${JSON.stringify(listed)}`)
    const p = listed.find((x) => x.pid === h.pid)
    assert.ok(p, `pid ${h.pid} is not listed`)
    assert.ok(listed.some((x) => x.pid === h2.pid), `pid ${h2.pid} is not listed`)
    assert.equal(p.cmd, '/bin/bash')
    assert.ok(p.args.join(' ').includes('sleep 300'), `args ${JSON.stringify(p.args)}`)

    // commands.kill(pid)
    assert.equal(await sbx.commands.kill(h.pid), true)
    const e = await rejection(h.wait(), 'wait() of a killed command')
    t.diagnostic(`wait() of a killed command: ${errName(e)}`)
    assert.ok(e instanceof CommandExitError, `expected CommandExitError, got ${errName(e)}`)
    assert.notEqual(e.exitCode, 0)
    await waitFor('the killed command to leave the list',
      async () => !(await sbx.commands.list()).some((x) => x.pid === h.pid), 10_000)
    assert.equal(await sbx.commands.kill(h.pid), false, 'killing a finished command returns false')

    // handle.kill()
    assert.equal(await h2.kill(), true)
    await rejection(h2.wait(), 'wait() of a killed command')
    await waitFor('the second killed command to leave the list',
      async () => !(await sbx.commands.list()).some((x) => x.pid === h2.pid), 10_000)

    // A background command that ends by itself: wait() gives its result.
    const h3 = await sbx.commands.run('sleep 1; echo done', { background: true })
    const r = await h3.wait()
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'done\n')

    // stdin of a background command.
    const h4 = await sbx.commands.run('read line; echo "got $line"', { background: true, stdin: true })
    await h4.sendStdin('hello-stdin\n')
    const r4 = await h4.wait()
    assert.equal(r4.stdout, 'got hello-stdin\n')

    // commands.connect re-attaches to a running command.
    const h5 = await sbx.commands.run('for i in 1 2 3 4; do echo tick$i; sleep 0.5; done', { background: true })
    await h5.disconnect()
    const h5b = await sbx.commands.connect(h5.pid)
    const r5 = await h5b.wait()
    assert.equal(r5.exitCode, 0)
    assert.ok(r5.stdout.includes('tick4\n'), `stdout after connect: ${JSON.stringify(r5.stdout)}`)
  })
})

test('pty: create, sendInput, onData, resize, exit', { timeout: TEST_TIMEOUT }, async () => {
  await withSandbox({}, async (sbx) => {
    const dec = new TextDecoder()
    let output = ''
    const term = await sbx.pty.create({
      cols: 80,
      rows: 24,
      timeoutMs: 30_000,
      onData: (data) => {
        assert.ok(data instanceof Uint8Array)
        output += dec.decode(data, { stream: true })
      },
    })
    assert.ok(term.pid > 0, `pty pid ${term.pid}`)
    const enc = new TextEncoder()

    // The product, not the echoed input, proves the shell ran the command.
    await sbx.pty.sendInput(term.pid, enc.encode('echo hello-pty-$((6*7))\n'))
    await waitFor('the PTY output of the echo', () => output.includes('hello-pty-42'))

    await sbx.pty.sendInput(term.pid, enc.encode('stty size; tty\n'))
    await waitFor('stty size 24 80', () => output.includes('24 80'))
    await waitFor('tty naming a pseudo-terminal (/dev/pts/N)', () => /\/dev\/pts\/\d+/.test(output))

    await sbx.pty.resize(term.pid, { cols: 100, rows: 40 })
    await sbx.pty.sendInput(term.pid, enc.encode('stty size\n'))
    await waitFor('stty size 40 100 after resize', () => output.includes('40 100'))

    await sbx.pty.sendInput(term.pid, enc.encode('exit\n'))
    const r = await term.wait()
    assert.equal(r.exitCode, 0)

    // A second PTY killed with pty.kill.
    const term2 = await sbx.pty.create({ cols: 80, rows: 24, timeoutMs: 30_000, onData: () => {} })
    assert.equal(await sbx.pty.kill(term2.pid), true)
    await rejection(term2.wait(), 'wait() of a killed PTY')
  })
})
