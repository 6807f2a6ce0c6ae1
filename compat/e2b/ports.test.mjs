// Sandbox ports through the unmodified SDK: getHost(port) names the host
// the daemon routes (serve --domain; the e2e daemon's is sbx.forkbox.test,
// given here as FORKBOX_E2B_DOMAIN), and a server started in the sandbox
// answers by E2B's headers and by that host name, with the sandbox's
// traffic access token; without it the port is closed (forkbox's default
// is private), with network.allowPublicTraffic it is open.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { withSandbox, waitFor, TEST_TIMEOUT } from './lib.mjs'

const base = new URL(process.env.E2B_SANDBOX_URL)
const domain = process.env.FORKBOX_E2B_DOMAIN

// get sends GET path to the daemon with headers and resolves to
// {status, body}.
function get(path, headers) {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: base.hostname, port: base.port, path, headers }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (c) => (body += c))
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
  })
}

async function startServer(sbx) {
  await sbx.files.write('/tmp/www/hello.txt', 'hello through the port\n')
  await sbx.commands.run('cd /tmp/www && python3 -m http.server -b 127.0.0.1 8000', { background: true })
  const headers = {
    'E2b-Sandbox-Id': sbx.sandboxId,
    'E2b-Sandbox-Port': '8000',
    'E2B-Traffic-Access-Token': sbx.trafficAccessToken,
  }
  await waitFor('the server in the sandbox', async () => (await get('/hello.txt', headers)).status === 200)
  return headers
}

test('getHost names a host the daemon routes; private by default', { timeout: TEST_TIMEOUT, skip: !domain && 'FORKBOX_E2B_DOMAIN is not set' }, async () => {
  await withSandbox({}, async (sbx) => {
    const host = sbx.getHost(8000)
    assert.equal(host, `8000-${sbx.sandboxId}.${domain}`)
    assert.ok(sbx.trafficAccessToken, 'create returned a traffic access token')
    const headers = await startServer(sbx)
    let r = await get('/hello.txt', headers)
    assert.equal(r.status, 200)
    assert.equal(r.body, 'hello through the port\n')
    r = await get('/hello.txt', { Host: host, 'E2B-Traffic-Access-Token': sbx.trafficAccessToken })
    assert.equal(r.status, 200)
    assert.equal(r.body, 'hello through the port\n')
    r = await get('/hello.txt', { Host: host })
    assert.equal(r.status, 403)
    r = await get('/', { ...headers, 'E2b-Sandbox-Port': '8009' })
    assert.equal(r.status, 502)
    assert.match(JSON.parse(r.body).message, /nothing listens on port 8009/)
  })
})

test('network.allowPublicTraffic opens the ports', { timeout: TEST_TIMEOUT, skip: !domain && 'FORKBOX_E2B_DOMAIN is not set' }, async () => {
  await withSandbox({ network: { allowPublicTraffic: true } }, async (sbx) => {
    await startServer(sbx)
    const r = await get('/hello.txt', { Host: sbx.getHost(8000) })
    assert.equal(r.status, 200)
    assert.equal(r.body, 'hello through the port\n')
  })
})
