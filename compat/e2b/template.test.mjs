// Template.build through the unmodified e2b SDK: the steps become a
// forkbox template that Sandbox.create(name) starts.
import assert from 'node:assert/strict'
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { test } from 'node:test'
import { BuildError, Sandbox, Template, waitForPort } from 'e2b'
import { RUN, SANDBOX_TIMEOUT_MS, SUITE_METADATA } from './lib.mjs'

test('Template.build: COPY, RUN, ENV, WORKDIR; Sandbox.create(name) starts it', { timeout: 240_000 }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'forkbox-e2b-tpl-'))
  writeFileSync(join(dir, 'hello.txt'), 'hello from the context\n')
  const name = `sdk-${RUN}`.toLowerCase()
  const logs = []
  const template = Template({ fileContextPath: dir })
    .fromTemplate('base')
    .copy('hello.txt', '/home/user/hello.txt')
    .setEnvs({ GREETING: 'built by the sdk' })
    .runCmd('echo "$GREETING" > /home/user/built.txt')
    .setWorkdir('/home/user')
  const info = await Template.build(template, name, { onBuildLogs: (e) => logs.push(e.message) })
  t.diagnostic(`build ${JSON.stringify(info)}; ${logs.length} log lines`)
  assert.equal(info.templateId, name)
  const sbx = await Sandbox.create(name, { timeoutMs: SANDBOX_TIMEOUT_MS, metadata: SUITE_METADATA })
  try {
    const r = await sbx.commands.run('cat hello.txt built.txt; echo "$GREETING"; pwd')
    assert.equal(r.stdout, 'hello from the context\nbuilt by the sdk\nbuilt by the sdk\n/home/user\n')
  } finally {
    await sbx.kill()
  }

  // A failing step fails the build with the step's output.
  const bad = Template().fromTemplate('base').runCmd('echo about to fail; exit 3')
  await assert.rejects(Template.build(bad, `${name}-bad`), (err) => {
    assert.ok(err instanceof BuildError, `${err}`)
    assert.match(err.message, /exit/i)
    return true
  })
})

test('Template.build: setStartCmd with waitForPort; Sandbox.create returns once the server answers', { timeout: 240_000 }, async () => {
  const name = `sdk-ready-${RUN}`.toLowerCase()
  // The server comes up a second after the start command starts, so a
  // create that did not wait for the ready check would find nothing.
  const template = Template()
    .fromTemplate('base')
    .runCmd('mkdir -p /home/user/site && echo served > /home/user/site/index.html')
    .setStartCmd('sleep 1; exec python3 -m http.server 8000 --bind 127.0.0.1 --directory /home/user/site', waitForPort(8000))
  await Template.build(template, name)
  const sbx = await Sandbox.create(name, { timeoutMs: SANDBOX_TIMEOUT_MS, metadata: SUITE_METADATA })
  try {
    const r = await sbx.commands.run('curl -fsS --max-time 5 http://127.0.0.1:8000/')
    assert.equal(r.stdout, 'served\n')
  } finally {
    await sbx.kill()
  }
})
