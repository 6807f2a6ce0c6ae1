// The unmodified @e2b/code-interpreter SDK (npm, pinned in package-lock.json)
// against a forkbox daemon. Configured only through the environment, as an
// E2B user's program is:
//
//   E2B_API_URL      the forkbox daemon (control plane), http://127.0.0.1:PORT
//   E2B_SANDBOX_URL  the same URL (sandbox calls carry E2b-Sandbox-Id)
//   E2B_API_KEY      the forkbox API key (sent as X-API-KEY)
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { test } from 'node:test'
import { Sandbox } from '@e2b/code-interpreter'

const missing = ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY'].filter((k) => !process.env[k])
if (missing.length > 0) {
  throw new Error(`set ${missing.join(', ')} to the forkbox daemon's URL and an API key`)
}

const RUN = `${Date.now().toString(36)}-${randomBytes(4).toString('hex')}`
const TEST_TIMEOUT = 120_000

// withSandbox creates a code-interpreter sandbox (the package's default
// template, code-interpreter-v1), runs fn(sandbox) and kills it after.
async function withSandbox(fn) {
  const sbx = await Sandbox.create({ timeoutMs: 180_000, metadata: { suite: 'forkbox-code-interpreter', run: RUN } })
  try {
    return await fn(sbx)
  } finally {
    await sbx.kill().catch(() => {})
  }
}

test('state between calls, the last value, streamed logs, errors', { timeout: TEST_TIMEOUT }, async () => {
  await withSandbox(async (sbx) => {
    await sbx.runCode('import pandas as pd; df = pd.DataFrame({"a": [1, 2]})')
    const r = await sbx.runCode('df.a.sum()')
    assert.equal(r.text, '3')
    assert.equal(r.error, undefined)

    // The cell prints, then waits for a file the test writes only once
    // the first line reached onStdout: the line came while the cell ran.
    const seen = []
    const e = await sbx.runCode(
      'import os, sys, time\nprint("first", flush=True)\nprint("warn", file=sys.stderr, flush=True)\n' +
        'while not os.path.exists("/tmp/go-on"):\n    time.sleep(0.05)\nprint("second")',
      {
        onStdout: async (m) => {
          seen.push(m.line)
          if (m.line === 'first\n') await sbx.files.write('/tmp/go-on', 'x')
        },
        onStderr: (m) => seen.push('err:' + m.line),
      }
    )
    assert.deepEqual(e.logs.stdout, ['first\n', 'second\n'])
    assert.deepEqual(e.logs.stderr, ['warn\n'])
    assert.ok(seen.includes('first\n') && seen.includes('err:warn\n'), `callbacks saw ${JSON.stringify(seen)}`)

    const err = await sbx.runCode('def f():\n    raise ValueError("bad value")\nf()')
    assert.equal(err.error.name, 'ValueError')
    assert.equal(err.error.value, 'bad value')
    assert.match(err.error.traceback, /bad value/)
    assert.ok(err.executionCount > 0, `executionCount ${err.executionCount}`)

    const envs = await sbx.runCode('import os; os.environ["FB_X"]', { envs: { FB_X: 'from the call' } })
    assert.equal(envs.text, 'from the call')
  })
})

test('a matplotlib chart: PNG and chart JSON; a pandas table as HTML', { timeout: TEST_TIMEOUT }, async () => {
  await withSandbox(async (sbx) => {
    const c = await sbx.runCode(
      'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [2, 4, 1])\nplt.title("Sales")\nplt.xlabel("month")\nplt.show()'
    )
    assert.equal(c.error, undefined, JSON.stringify(c.error))
    assert.equal(c.results.length, 1)
    const res = c.results[0]
    assert.ok(res.png && Buffer.from(res.png, 'base64').subarray(1, 4).toString() === 'PNG', 'no PNG')
    assert.equal(res.chart.type, 'line')
    assert.equal(res.chart.title, 'Sales')
    assert.equal(res.chart.x_label, 'month')
    assert.equal(res.chart.elements.length, 1)

    const bar = await sbx.runCode('fig, ax = plt.subplots()\nax.bar(["a", "b"], [3, 4])\nax.set_title("Bars")\nplt.show()')
    assert.equal(bar.results[0].chart.type, 'bar')

    const t = await sbx.runCode('import pandas as pd\npd.DataFrame({"x": [1, 2, 3]})')
    assert.match(t.results[0].html, /<table/)
    assert.ok(t.results[0].isMainResult)
  })
})

test('contexts: separate state, list, restart, delete; bash and JavaScript', { timeout: TEST_TIMEOUT }, async () => {
  await withSandbox(async (sbx) => {
    const a = await sbx.createCodeContext({ cwd: '/tmp' })
    const b = await sbx.createCodeContext({ language: 'python' })
    assert.equal(a.cwd, '/tmp')
    await sbx.runCode('v = "a"', { context: a })
    const inB = await sbx.runCode('v', { context: b })
    assert.equal(inB.error.name, 'NameError')
    assert.equal((await sbx.runCode('import os; os.getcwd()', { context: a })).text, '/tmp')

    const ids = (await sbx.listCodeContexts()).map((c) => c.id)
    assert.ok(ids.includes(a.id) && ids.includes(b.id), `listed ${ids}`)

    await sbx.restartCodeContext(a)
    assert.equal((await sbx.runCode('v', { context: a })).error.name, 'NameError')
    await sbx.removeCodeContext(b)
    assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === b.id))
    // (A short requestTimeoutMs: the SDK leaves that timer running when the
    // call fails, which would hold the test process for a minute.)
    await assert.rejects(sbx.runCode('1', { context: b, requestTimeoutMs: 2_000 }), (e) => e.name === 'NotFoundError')

    const sh = await sbx.createCodeContext({ language: 'bash' })
    await sbx.runCode('n=41; cd /tmp', { context: sh })
    const shOut = await sbx.runCode('echo $((n + 1)) $(pwd) $(whoami)', { context: sh })
    assert.deepEqual(shOut.logs.stdout, ['42 /tmp user\n'])

    await sbx.runCode('var count = 40', { language: 'javascript' })
    const js = await sbx.runCode('count + 2', { language: 'javascript' })
    assert.equal(js.text, '42')
  })
})

test('a cell past its timeout is interrupted; the kernel keeps its state', { timeout: TEST_TIMEOUT }, async () => {
  await withSandbox(async (sbx) => {
    await sbx.runCode('kept = 7')
    await assert.rejects(
      sbx.runCode('import time\nwhile True:\n    time.sleep(0.01)', { timeoutMs: 2_000 }),
      (e) => e.name === 'TimeoutError'
    )
    const r = await sbx.runCode('kept * 6')
    assert.equal(r.text, '42')
    assert.equal(r.error, undefined)
  })
})

test('bad input: both context and language, an unknown language', { timeout: TEST_TIMEOUT }, async () => {
  await withSandbox(async (sbx) => {
    await assert.rejects(sbx.createCodeContext({ language: 'cobol' }), /400/)
    const ctx = await sbx.createCodeContext()
    await assert.rejects(sbx.runCode('1', { context: ctx, language: 'python' }), (e) => e.name === 'InvalidArgumentError')
    const syntax = await sbx.runCode('print(')
    assert.equal(syntax.error.name, 'SyntaxError')
  })
})
