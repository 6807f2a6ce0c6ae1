// Drives forkbox's MCP server with the unmodified TypeScript SDK's client,
// over stdio (spawning `forkbox mcp`) and over streamable HTTP (the
// daemon's /mcp, the API key as bearer token): tools listed, a sandbox
// created, a command run, a file written and read (as a tool and as a
// resource), bad input as a tool error, the sandbox destroyed.
// Needs FORKBOX_URL, FORKBOX_API_KEY and FORKBOX_BIN (the forkbox binary).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const url = process.env.FORKBOX_URL;
const key = process.env.FORKBOX_API_KEY;
const bin = process.env.FORKBOX_BIN;
if (!url || !key || !bin) {
  throw new Error('set FORKBOX_URL, FORKBOX_API_KEY and FORKBOX_BIN');
}

const transports = {
  stdio: () => new StdioClientTransport({
    command: bin,
    args: ['mcp'],
    env: { PATH: process.env.PATH, FORKBOX_URL: url, FORKBOX_API_KEY: key },
    stderr: 'inherit',
  }),
  http: () => new StreamableHTTPClientTransport(new URL('/mcp', url), {
    requestInit: { headers: { Authorization: `Bearer ${key}` } },
  }),
};

// call calls a tool and returns its structured output; a tool error fails.
async function call(client, name, args) {
  const res = await client.callTool({ name, arguments: args });
  assert.ok(!res.isError, `${name}: tool error: ${JSON.stringify(res.content)}`);
  assert.ok(res.structuredContent, `${name}: no structured content`);
  return res.structuredContent;
}

for (const [kind, make] of Object.entries(transports)) {
  test(`MCP over ${kind}: create, run, files, destroy`, async () => {
    const client = new Client({ name: 'forkbox-compat', version: '1.0.0' });
    await client.connect(make());
    try {
      const { tools } = await client.listTools();
      const names = tools.map((t) => t.name);
      for (const want of ['create_sandbox', 'run_command', 'run_code', 'read_file', 'write_file', 'list_files',
        'snapshot', 'fork', 'pause', 'resume', 'destroy', 'list_sandboxes']) {
        assert.ok(names.includes(want), `tools ${names} lack ${want}`);
      }
      const create = tools.find((t) => t.name === 'create_sandbox');
      assert.deepEqual(create.inputSchema.properties.tier.enum, ['runc', 'gvisor']);

      const bad = await client.callTool({ name: 'create_sandbox', arguments: { template: 'no-such-template' } });
      assert.equal(bad.isError, true);
      assert.match(bad.content[0].text, /no-such-template/);

      const sb = await call(client, 'create_sandbox', {});
      assert.equal(sb.state, 'running');
      try {
        const out = await call(client, 'run_command', { sandbox_id: sb.id, command: `echo from-${kind}; exit 7` });
        assert.equal(out.exit_code, 7);
        assert.equal(out.stdout, `from-${kind}\n`);

        await call(client, 'write_file', { sandbox_id: sb.id, path: '/home/user/ts.txt', content: `written over ${kind}` });
        const rd = await call(client, 'read_file', { sandbox_id: sb.id, path: '/home/user/ts.txt' });
        assert.equal(rd.content, `written over ${kind}`);
        const res = await client.readResource({ uri: `forkbox://sandbox/${sb.id}/files/home/user/ts.txt` });
        assert.equal(res.contents[0].text, `written over ${kind}`);
        const cat = await call(client, 'run_command', { sandbox_id: sb.id, command: 'cat /home/user/ts.txt' });
        assert.equal(cat.stdout, `written over ${kind}`);
      } finally {
        await call(client, 'destroy', { sandbox_id: sb.id });
      }
      const gone = await client.callTool({ name: 'run_command', arguments: { sandbox_id: sb.id, command: 'true' } });
      assert.equal(gone.isError, true);
    } finally {
      await client.close();
    }
  });
}
